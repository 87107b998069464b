package chaintest

import (
	"fmt"
	"slices"
)

// maxShrinkChecks bounds the checks one shrink makes.
const maxShrinkChecks = 200

// shrink looks for a smaller chain that still fails alone, removing and
// simplifying one step at a time while the chain keeps failing. It returns
// the smallest found and its failure; ID -1 when ch does not fail alone
// (its failure depended on the chains checked beside it).
func (s *suite) shrink(ch Chain) (Chain, error) {
	_, failure := s.check(ch)
	if failure == nil {
		return Chain{ID: -1}, nil
	}
	for checks := 0; checks < maxShrinkChecks; {
		smaller := false
		for _, c := range simpler(ch) {
			checks++
			if _, err := s.check(c); err != nil {
				ch, failure, smaller = c, err, true
				break
			}
			if checks == maxShrinkChecks {
				break
			}
		}
		if !smaller {
			break
		}
	}
	return ch, failure
}

// simpler returns the chains one step simpler than ch: a step fewer, no
// forced run again, a guard that refuses from the first run, the first
// idiom of a kind.
func simpler(ch Chain) []Chain {
	var out []Chain
	add := func(c Chain) { out = append(out, relabel(c)) }
	for i := range ch.Outer {
		c := clone(ch)
		c.Outer = slices.Delete(c.Outer, i, i+1)
		add(c)
	}
	for i := range ch.Inner {
		if len(ch.Inner) > 1 {
			c := clone(ch)
			c.Inner = slices.Delete(c.Inner, i, i+1)
			add(c)
		}
	}
	if ch.Rerun != RerunNone {
		c := clone(ch)
		c.Rerun = RerunNone
		add(c)
	}
	for i, st := range ch.Inner {
		if st.From > 1 {
			c := clone(ch)
			c.Inner[i].From = 1
			add(c)
		}
		if st.Variant != 0 {
			c := clone(ch)
			c.Inner[i].Variant = 0
			add(c)
		}
	}
	return out
}

func clone(ch Chain) Chain {
	ch.Outer, ch.Inner = slices.Clone(ch.Outer), slices.Clone(ch.Inner)
	return ch
}

func relabel(ch Chain) Chain {
	for i := range ch.Outer {
		ch.Outer[i].Label = fmt.Sprintf("o%d", i)
	}
	for i := range ch.Inner {
		ch.Inner[i].Label = fmt.Sprintf("i%d", i)
	}
	return ch
}
