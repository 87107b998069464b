package main

// The fleet family's immediate retries (issue 25): each retry comes right
// after the answer it retries, from the same client, and lands on another
// instance than the one that answered, as an agent whose tool gateway
// re-sends a call at once does behind a load balancer. The recent-keys mix
// (fleetMix) retries keys answered up to a second before, so it never sees
// what a retry finds the moment the original has answered.
//
// The same retries sent to the instance that answered (same) are answered
// from its own replay cache, with no call out of the process: in the same
// mix, their P99 is the floor of any replay's, whatever it reads.

import (
	"math/rand/v2"
	"net/http"
	"slices"
)

// fleetImmediate is the workload: new keys on a random instance; after a
// new key's answer, with probability retry/(1-retry), the worker's next
// request retries it on one of the other instances, so that retries are
// the share retry of all requests.
type fleetImmediate struct {
	urls    []string
	retry   float64
	same    bool             // retry on the instance that answered
	pending []immediateRetry // by worker id: each worker touches its own
}

type immediateRetry struct {
	entry poolEntry
	from  int // the instance that answered the original
	set   bool
}

func newFleetImmediate(urls []string, retry float64, conc int, same bool) *fleetImmediate {
	return &fleetImmediate{urls: urls, retry: retry, same: same, pending: make([]immediateRetry, conc)}
}

func (m *fleetImmediate) gen(w *worker) request {
	if p := &m.pending[w.id]; p.set {
		p.set = false
		rq := p.entry.replay()
		to := (p.from + 1 + rand.IntN(len(m.urls)-1)) % len(m.urls)
		if m.same {
			to = p.from
		}
		rq.url, rq.kind = m.urls[to], kindReplay
		return rq
	}
	rq := genNewKey(w)
	rq.url, rq.kind = m.urls[rand.IntN(len(m.urls))], kindNew
	return rq
}

func (m *fleetImmediate) done(w *worker, rq request, status int, err error) {
	if err != nil || rq.kind != kindNew || rand.Float64() >= m.retry/(1-m.retry) {
		return
	}
	m.pending[w.id] = immediateRetry{
		entry: answered(w, rq),
		from:  slices.Index(m.urls, rq.url),
		set:   true,
	}
}

// immediateTarget is the mixed target of immediate retries over urls, each
// on another instance than the one that answered, or with same on that one.
func immediateTarget(urls []string, retry float64, conc int, same bool) target {
	m := newFleetImmediate(urls, retry, conc, same)
	return target{url: urls[0], keyHeader: "Idempotency-Key", gen: m.gen, done: m.done, wantStatus: http.StatusCreated}
}
