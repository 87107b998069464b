package main

// The fleet family's immediate retries (issue 25): each retry comes right
// after the answer it retries, from the same client, and lands on another
// instance than the one that answered, as an agent whose tool gateway
// re-sends a call at once does behind a load balancer. The recent-keys mix
// (fleetMix) retries keys answered up to a second before, so it never sees
// what a retry finds the moment the original has answered.

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
	pending []immediateRetry // by worker id: each worker touches its own
}

type immediateRetry struct {
	entry poolEntry
	from  int // the instance that answered the original
	set   bool
}

func newFleetImmediate(urls []string, retry float64, conc int) *fleetImmediate {
	return &fleetImmediate{urls: urls, retry: retry, pending: make([]immediateRetry, conc)}
}

func (m *fleetImmediate) gen(w *worker) request {
	if p := &m.pending[w.id]; p.set {
		p.set = false
		rq := p.entry.replay()
		rq.url, rq.kind = m.urls[(p.from+1+rand.IntN(len(m.urls)-1))%len(m.urls)], kindReplay
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

// immediateTarget is the mixed target of immediate retries over urls.
func immediateTarget(urls []string, retry float64, conc int) target {
	m := newFleetImmediate(urls, retry, conc)
	return target{url: urls[0], keyHeader: "Idempotency-Key", gen: m.gen, done: m.done, wantStatus: http.StatusCreated}
}
