package main

import (
	"testing"
)

// The fleet family runs in CI's quick run too (reduced: runFleet), unless
// turned off.
func TestFleetFamilyRunsInQuickUnlessTurnedOff(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"-quick"}, true},
		{[]string{"-quick", "-fleet=false"}, false},
		{[]string{"-fleet=false"}, false},
	} {
		o, err := parseOptions(c.args)
		if err != nil {
			t.Fatal(err)
		}
		if o.fleet != c.want {
			t.Fatalf("%q: fleet %v, want %v", c.args, o.fleet, c.want)
		}
	}
}

// Retries are of keys answered before, carry the answer to compare and ask
// for the replay marker; every request goes to one of the instances.
func TestFleetMixRetriesAnsweredKeysOnAnyInstance(t *testing.T) {
	urls := []string{"http://i1", "http://i2", "http://i3"}
	m := &fleetMix{urls: urls, retry: 0.5, recent: make([]poolEntry, 4)}
	w := newWorker(0)
	first := m.gen(w)
	if first.kind != kindNew {
		t.Fatalf("nothing answered yet, but the first request is a %q", first.kind)
	}
	w.buf.WriteString(`{"order_no":"O1"}`)
	m.done(w, first, 201, nil)
	seen := map[string]bool{}
	var retries int
	for range 400 {
		rq := m.gen(w)
		seen[rq.url] = true
		if rq.kind == kindReplay {
			retries++
			if rq.key != first.key || string(rq.want) != `{"order_no":"O1"}` {
				t.Fatalf("retry of %q wanting %q, want the answered key %q", rq.key, rq.want, first.key)
			}
		}
	}
	if len(seen) != len(urls) {
		t.Fatalf("requests reached %d of %d instances", len(seen), len(urls))
	}
	if retries < 120 || retries > 280 {
		t.Fatalf("%d retries in 400 at a share of 0.5", retries)
	}
}
