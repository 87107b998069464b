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

// An immediate retry is the worker's very next request after the answer it
// retries, on another instance than the one that answered (or, asked for
// the same, on that one), wanting that answer; retries are about the share
// asked of all requests.
func TestFleetImmediateRetriesRightAfterTheAnswerOnAnotherInstance(t *testing.T) {
	for _, same := range []bool{false, true} {
		t.Run(map[bool]string{false: "another instance", true: "same instance"}[same], func(t *testing.T) {
			urls := []string{"http://i1", "http://i2", "http://i3"}
			m := newFleetImmediate(urls, 0.2, 1, same)
			w := newWorker(0)
			var requests, retries int
			var last request
			for range 4000 {
				rq := m.gen(w)
				requests++
				if rq.kind == kindReplay {
					retries++
					if last.kind != kindNew || rq.key != last.key || string(rq.want) != "answer of "+last.key {
						t.Fatalf("a retry of %q (wanting %q) after a %q request for %q: want the previous new key", rq.key, rq.want, last.kind, last.key)
					}
					if (rq.url == last.url) != same {
						t.Fatalf("a retry on %s after an answer from %s, same instance asked: %v", rq.url, last.url, same)
					}
				}
				w.buf.Reset()
				w.buf.WriteString("answer of " + rq.key)
				m.done(w, rq, 201, nil)
				last = rq
			}
			if share := float64(retries) / float64(requests); share < 0.17 || share > 0.23 {
				t.Fatalf("retries are %.3f of requests, want about 0.2", share)
			}
		})
	}
}
