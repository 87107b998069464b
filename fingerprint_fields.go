package idempotency

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// The field lists of FingerprintConfig: which top-level members of a JSON
// body count, and names that encoding/json would read differently.

// fieldFilter applies FingerprintConfig's field lists to the top-level object.
type fieldFilter struct {
	hasAllow bool // false: every field not denied counts
	// byFold maps the folded form of each listed name to the listed names
	// with that form (nearly always one), so one lookup finds both a listed
	// name and a name that is listed only ignoring case.
	byFold map[string][]listedName
}

type listedName struct {
	name        string
	allow, deny bool
	ownFold     bool // name is its own folded form
}

// add returns the entry for name, created if new.
func (f *fieldFilter) add(name string) *listedName {
	k := name
	if folded, same := appendFoldedName(nil, []byte(name)); !same {
		k = string(folded)
	}
	names := f.byFold[k]
	for i := range names {
		if names[i].name == name {
			return &names[i]
		}
	}
	f.byFold[k] = append(names, listedName{name: name, ownFold: k == name})
	return &f.byFold[k][len(f.byFold[k])-1]
}

// match returns the name of names, listed names of one folded form, that
// key is exactly, or nil; and when key is none of them, the first as
// misspelt.
func match(names []listedName, key []byte) (listed *listedName, misspelt string) {
	for i := range names {
		if names[i].name == string(key) {
			return &names[i], ""
		}
	}
	if len(names) > 0 {
		return nil, names[0].name
	}
	return nil, ""
}

// drops reports whether a member leaves the fingerprint: a denied one, and
// with an allow-list one not allowed or allowed but null, so that null
// equals an absent field. Deny wins.
func (f *fieldFilter) drops(listed *listedName, value []byte) bool {
	if listed != nil && listed.deny {
		return true
	}
	return f.hasAllow && (listed == nil || !listed.allow || string(value) == "null")
}

// appendFoldedName appends name folded so that two names fold alike exactly
// when bytes.EqualFold reports them equal, which is how encoding/json
// matches names to struct fields: each rune becomes one chosen rune of its
// unicode.SimpleFold orbit (so 'ſ' and 'S' become 's', the Kelvin sign
// 'k'). The chosen rune is the ASCII lower-case letter where the orbit has
// one, else its smallest rune, so that the usual lower-case names are their
// own folded form: then it appends nothing and reports same, to spare the
// copy. name must be valid UTF-8.
func appendFoldedName(dst, name []byte) (folded []byte, same bool) {
	i := 0
	// Skip eight bytes at a time while none is non-ASCII or in 'A'..'Z':
	// with the high bits cleared, adding 0x3f sets a byte's high bit from
	// 'A' up and adding 0x25 from 'Z'+1 up, never carrying into the next.
	const high = 0x8080808080808080
	for ; i+8 <= len(name); i += 8 {
		w := binary.LittleEndian.Uint64(name[i:])
		x := w &^ high
		if (w|(x+0x3f3f3f3f3f3f3f3f)&^(x+0x2525252525252525))&high != 0 {
			break
		}
	}
	for i < len(name) {
		b := name[i]
		if b >= utf8.RuneSelf {
			r, n := utf8.DecodeRune(name[i:])
			if foldRune(r) != r {
				break
			}
			i += n
			continue
		}
		if 'A' <= b && b <= 'Z' {
			break
		}
		i++
	}
	if i == len(name) {
		return dst, true
	}
	dst = append(dst, name[:i]...)
	for i < len(name) {
		b := name[i]
		if b < utf8.RuneSelf {
			if 'A' <= b && b <= 'Z' {
				b += 'a' - 'A'
			}
			dst = append(dst, b)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst, false
}

// foldRune returns the rune appendFoldedName chooses for r's orbit.
func foldRune(r rune) rune {
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	if 'A' <= smallest && smallest <= 'Z' {
		return smallest + 'a' - 'A'
	}
	return smallest
}

// filterMember applies the field lists to the top-level member m, noting
// whether its key differs from its folded form and whether it is a listed
// name only ignoring case, for checkFoldedKeys. It reports whether m is
// dropped.
func (c *canonicalizer) filterMember(filter *fieldFilter, m *jsonMember, value []byte) bool {
	key := c.key(m)
	// The common case first: a listed name that is its own folded form,
	// found without folding the key.
	names := filter.byFold[string(key)]
	for i := range names {
		if names[i].ownFold && names[i].name == string(key) {
			m.drop = filter.drops(&names[i], value)
			return m.drop
		}
	}
	if folded, same := appendFoldedName(c.folded[:0], key); !same {
		// Map keys are folded forms, so the lookup above missed: look up
		// the key's folded form instead.
		c.folded, c.foldChanged = folded[:0], true
		names = filter.byFold[string(folded)]
	}
	listed, misspelt := match(names, key)
	if misspelt != "" && c.misspeltAs == "" {
		// The key stays where it is (data or keys) until the object closes.
		c.misspelt, c.misspeltAs = key, misspelt
	}
	m.drop = filter.drops(listed, value)
	return m.drop
}

// checkFoldedKeys refuses a filtered top-level object, whose members ms
// have no duplicate keys, if encoding/json and the field lists could read
// its names differently: two names equal ignoring case (encoding/json
// decodes the last into one field, a strict decoder rejects the body, and
// no fingerprint can agree with both), or a name equal to a listed one only
// ignoring case (encoding/json decodes it into the listed field, the field
// lists treat it as another).
//
// When every key is its own folded form, as lower-case names are, equal
// folded forms would be equal keys, so there is nothing to look for.
// Otherwise sorting the folded forms finds equal ones in O(n log n) without
// allocating; ties sort in input order, so a pair is named as sent.
func (c *canonicalizer) checkFoldedKeys(ms []jsonMember) error {
	if c.foldChanged {
		c.folded, c.foldedKeys = c.folded[:0], c.foldedKeys[:0]
		for i := range ms {
			at := len(c.folded)
			folded, same := appendFoldedName(c.folded, c.key(&ms[i]))
			if same {
				folded = append(folded, c.key(&ms[i])...)
			}
			c.folded = folded
			c.foldedKeys = append(c.foldedKeys, foldedKey{m: &ms[i], foldAt: at, foldLen: len(folded) - at})
		}
		fks := c.foldedKeys
		slices.SortFunc(fks, func(a, b foldedKey) int {
			if d := bytes.Compare(c.foldOf(&a), c.foldOf(&b)); d != 0 {
				return d
			}
			return a.m.start - b.m.start // input order
		})
		for i := 1; i < len(fks); i++ {
			if bytes.Equal(c.foldOf(&fks[i-1]), c.foldOf(&fks[i])) {
				return fmt.Errorf("%w: JSON: names %+q and %+q are equal ignoring case; send each field once, spelled exactly",
					ErrInvalidBody, c.key(fks[i-1].m), c.key(fks[i].m))
			}
		}
	}
	if c.misspeltAs != "" {
		return fmt.Errorf("%w: JSON: name %+q is the field %+q ignoring case; spell listed fields exactly",
			ErrInvalidBody, c.misspelt, c.misspeltAs)
	}
	return nil
}

func (c *canonicalizer) foldOf(fk *foldedKey) []byte {
	return c.folded[fk.foldAt : fk.foldAt+fk.foldLen]
}
