package main

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// users is how many principals (X-User-ID, the idempotency scope) the load
// spreads over; worker w acts as user w%users+1. B4's bulk loader spreads the
// existing records over the same scopes.
const users = 16

// Catalog range seeded by orderservice.Setup (kept literal so that the load
// generator needs nothing from the service package).
const (
	firstSKU = 20001
	numSKUs  = 100
)

var (
	hdrJSON    = []string{"application/json"}
	userHeader = func() [][]string {
		out := make([][]string, users+1)
		for u := 1; u <= users; u++ {
			out[u] = []string{strconv.Itoa(u)}
		}
		return out
	}()
	// bodies[user][sku-firstSKU] is the create body; prebuilt so the load
	// generator allocates as little as possible per request.
	bodies = func() [][][]byte {
		out := make([][][]byte, users+1)
		for u := 1; u <= users; u++ {
			out[u] = make([][]byte, numSKUs)
			for s := range numSKUs {
				out[u][s] = fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":1}`, u, firstSKU+s)
			}
		}
		return out
	}()
)

// request is one request a worker sends.
type request struct {
	key  string // "" sends no key header
	user int
	sku  int // index into the catalog (firstSKU+sku), as body has it
	body []byte
	want []byte // if set, the response body must equal it (a replay)
	url  string // if set, sent here instead of the target's url (several instances)
	// kind, if set, files the request's latency under it too (sample.kindLat),
	// for a point mixing several kinds of request; kindReplay also requires
	// the replay marker.
	kind string
}

// Request kinds of a mixed workload (the fleet family).
const (
	kindNew    = "new"
	kindReplay = "replay"
)

// generator returns worker w's next request.
type generator func(w *worker) request

// target is what a load point drives: a URL and the requests to send there.
type target struct {
	url       string
	keyHeader string // header carrying the key ("Idempotency-Key")
	gen       generator
	// wantStatus is the status every answer must have; wantReplayed also
	// requires Idempotent-Replayed: true (our middleware's replay marker).
	wantStatus   int
	wantReplayed bool
	// done, if set, is told every answer (the worker's buffer holds its
	// body): the fleet family learns the keys it may retry from it.
	done func(w *worker, rq request, status int, err error)
	// tolerateStatus, if set, is a status counted (in statuses) but neither
	// as an error nor as a completed request: the cluster family's bare
	// baseline on two nodes, whose commits can fail certification (503).
	tolerateStatus int
	// call, if set, sends the request instead of HTTP (the gRPC family):
	// it returns the answer's status in HTTP's terms, leaves its body in
	// w.buf, and reports whether it was marked a replay.
	call func(w *worker, rq request) (status int, replayed bool, err error)
}

// genBaseline: no key (B0).
func genBaseline(w *worker) request {
	w.n++
	u, sku := w.user(), (w.id*7+w.n)%numSKUs
	return request{user: u, sku: sku, body: bodies[u][sku]}
}

// genNewKey: a fresh key every time (B1).
func genNewKey(w *worker) request {
	r := genBaseline(w)
	r.key = w.newKey()
	return r
}

// poolEntry is a completed key and the answer its first request got.
type poolEntry struct {
	key  string
	user int
	sku  int
	body []byte
	resp []byte
	url  string // if set, where its replays go (request.url)
}

// answered is the completed key of rq, whose answer is in w's buffer.
func answered(w *worker, rq request) poolEntry {
	return poolEntry{key: rq.key, user: rq.user, sku: rq.sku, body: rq.body, resp: bytes.Clone(w.buf.Bytes())}
}

// replay is a request replaying e: its answer must be e's.
func (e *poolEntry) replay() request {
	return request{key: e.key, user: e.user, sku: e.sku, body: e.body, want: e.resp, url: e.url}
}

// genReplay replays pool round-robin (B2).
func genReplay(pool []poolEntry) generator {
	var next atomic.Uint64
	return func(w *worker) request {
		return pool[(next.Add(1)-1)%uint64(len(pool))].replay()
	}
}

// sample is the outcome of one load point.
type sample struct {
	lat      []time.Duration            // latencies of requests completed in the window
	kindLat  map[string][]time.Duration // the same, by request.kind (sorted)
	requests int64
	errors   int64
	statuses map[int]int
	firstErr string
	window   time.Duration
	probe    map[string]float64 // per-request server counters, CPU
}

// runLoad drives t with conc closed-loop workers: each sends its next request
// as soon as the previous answer arrives. Requests completing during warmup
// are not recorded; the measurement window is dur long. probe, if not nil, is
// called at the window's start and end (its difference is reported per
// request).
func runLoad(client *http.Client, t target, conc int, warmup, dur time.Duration, probe func() map[string]float64) sample {
	start := time.Now()
	winStart := start.Add(warmup)
	winEnd := winStart.Add(dur)
	type result struct {
		lat      []time.Duration
		kindLat  map[string][]time.Duration
		errors   int64
		statuses map[int]int
		firstErr string
	}
	results := make([]result, conc)
	var wg sync.WaitGroup
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker(i)
			w.ownConns()
			defer w.close()
			res := &results[i]
			res.lat = make([]time.Duration, 0, 4096)
			res.statuses = map[int]int{}
			res.kindLat = map[string][]time.Duration{}
			for {
				now := time.Now()
				if now.After(winEnd) {
					return
				}
				rq := t.gen(w)
				status, err := w.do(client, t, rq)
				done := time.Now()
				if t.done != nil {
					t.done(w, rq, status, err)
				}
				if done.Before(winStart) || done.After(winEnd) {
					if err != nil {
						time.Sleep(5 * time.Millisecond)
					}
					continue
				}
				res.statuses[status]++
				if err != nil && t.tolerateStatus != 0 && status == t.tolerateStatus {
					continue
				}
				if err != nil {
					res.errors++
					if res.firstErr == "" {
						res.firstErr = err.Error()
					}
					time.Sleep(5 * time.Millisecond) // don't spin on a dead server
					continue
				}
				res.lat = append(res.lat, done.Sub(now))
				if rq.kind != "" {
					res.kindLat[rq.kind] = append(res.kindLat[rq.kind], done.Sub(now))
				}
			}
		}()
	}
	var before, after map[string]float64
	if probe != nil {
		time.Sleep(time.Until(winStart))
		before = probe()
		time.Sleep(time.Until(winEnd))
		after = probe()
	}
	wg.Wait()

	s := sample{statuses: map[int]int{}, window: dur}
	for _, r := range results {
		s.lat = append(s.lat, r.lat...)
		for k, l := range r.kindLat {
			if s.kindLat == nil {
				s.kindLat = map[string][]time.Duration{}
			}
			s.kindLat[k] = append(s.kindLat[k], l...)
		}
		s.errors += r.errors
		for k, v := range r.statuses {
			s.statuses[k] += v
		}
		if s.firstErr == "" {
			s.firstErr = r.firstErr
		}
	}
	s.requests = int64(len(s.lat)) + s.errors
	slices.Sort(s.lat)
	for _, l := range s.kindLat {
		slices.Sort(l)
	}
	s.probe = perRequest(before, after, dur, s.requests)
	return s
}

// createPool creates n completed keys through t (a first-request target) with
// conc workers, and returns them with the answers they got.
func createPool(client *http.Client, t target, n, conc int) ([]poolEntry, error) {
	pool := make([]poolEntry, n)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker(i)
			for {
				j := next.Add(1) - 1
				if j >= int64(n) {
					return
				}
				rq := genNewKey(w)
				w.id = int(j) // spread the pool over users and SKUs
				rq.user = w.user()
				rq.sku = int(j) % numSKUs
				rq.body = bodies[rq.user][rq.sku]
				if _, err := w.do(client, t, rq); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("creating the replay pool: %w", err)
					}
					mu.Unlock()
					return
				}
				pool[j] = answered(w, rq)
			}
		}()
	}
	wg.Wait()
	return pool, firstErr
}
