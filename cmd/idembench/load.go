package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency/client"
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

type worker struct {
	id    int
	n     int
	buf   bytes.Buffer
	req   []byte              // the request being written (own connections)
	conns map[string]*ownConn // by URL, when the worker has its own (ownConns)
}

func (w *worker) user() int { return w.id%users + 1 }

// newKey is a fresh key per request, as a client creates one per intent: a
// UUIDv4, 36 characters, which is also what Fiber's idempotency middleware
// expects.
func (w *worker) newKey() string { return client.NewKey() }

func newWorker(id int) *worker { return &worker{id: id} }

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
}

// genReplay replays pool round-robin (B2).
func genReplay(pool []poolEntry) generator {
	var next atomic.Uint64
	return func(w *worker) request {
		e := &pool[(next.Add(1)-1)%uint64(len(pool))]
		return request{key: e.key, user: e.user, sku: e.sku, body: e.body, want: e.resp}
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

// perRequest turns two probe readings around a window into the point's
// server columns: CPU as percent of one core over the window and
// milliseconds per request, counters per request.
func perRequest(before, after map[string]float64, dur time.Duration, requests int64) map[string]float64 {
	if before == nil || after == nil || requests == 0 {
		return nil
	}
	out := map[string]float64{}
	for k, a := range after {
		d := a - before[k]
		if strings.HasPrefix(k, "cpu_") {
			// CPU seconds → percent of one core over the window, and
			// milliseconds per request.
			out[k] = 100 * d / dur.Seconds()
			if k == "cpu_self" || k == "cpu_db" || k == "cpu_redis" {
				out[k+"_ms_per_req"] = 1000 * d / float64(requests)
			}
			continue
		}
		out[k] = d / float64(requests)
	}
	if total, ok := out["cpu_total"]; ok {
		// Everything else on the machine: other engineers' builds and
		// tests show up here, and make the point noisy.
		out["cpu_other"] = max(0, total-out["cpu_self"]-out["cpu_db"]-out["cpu_redis"])
		delete(out, "cpu_total")
	}
	return out
}

// do sends one request and checks its answer. A wrong status, a missing
// replay marker or a replayed body that differs from the original is an
// error; the status is returned either way (0 for a transport error).
func (w *worker) do(client *http.Client, t target, rq request) (int, error) {
	if t.call != nil {
		status, replayed, err := t.call(w, rq)
		if err != nil {
			return status, err
		}
		return status, w.check(t, rq, status, replayed)
	}
	url := t.url
	if rq.url != "" {
		url = rq.url
	}
	var resp *http.Response
	var err error
	if w.conns != nil {
		resp, err = w.roundTrip(url, t.keyHeader, rq)
	} else {
		resp, err = w.clientRoundTrip(client, url, t.keyHeader, rq)
	}
	if err != nil {
		return 0, err
	}
	w.buf.Reset()
	_, err = io.Copy(&w.buf, resp.Body)
	resp.Body.Close()
	if w.conns != nil && (err != nil || resp.Close) {
		w.drop(url)
	}
	if err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, w.check(t, rq, resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true")
}

// check checks an answer whose body is in w.buf: its status, the replay
// mark a replay needs, and a replay's body against the original's.
func (w *worker) check(t target, rq request, status int, replayed bool) error {
	if status != t.wantStatus {
		return fmt.Errorf("status %d, want %d: %.200s", status, t.wantStatus, w.buf.Bytes())
	}
	if (t.wantReplayed || rq.kind == kindReplay) && !replayed {
		return fmt.Errorf("answer not marked a replay: %.200s", w.buf.Bytes())
	}
	if rq.want != nil && !bytes.Equal(w.buf.Bytes(), rq.want) {
		return fmt.Errorf("replayed body differs from the original:\n got %.200s\nwant %.200s", w.buf.Bytes(), rq.want)
	}
	return nil
}

func (w *worker) clientRoundTrip(client *http.Client, url, keyHeader string, rq request) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(rq.body))
	if err != nil {
		return nil, err
	}
	req.Header["Content-Type"] = hdrJSON
	req.Header["X-User-Id"] = userHeader[rq.user]
	if rq.key != "" {
		req.Header[keyHeader] = []string{rq.key}
	}
	return client.Do(req)
}

// ownConns gives the worker keep-alive connections of its own, one per
// server, on which it writes each request and reads its answer itself
// (roundTrip). net/http's Transport hands every request to a writer and a
// reader goroutine per connection and back: at tens of thousands of
// requests a second on two cores those handoffs were a fifth of the
// process's CPU and set the harness's own latency tail, which a cached
// replay is measured against. close releases them.
func (w *worker) ownConns() { w.conns = map[string]*ownConn{} }

// ownConn is one of a worker's HTTP/1.1 connections.
type ownConn struct {
	c    net.Conn
	r    *bufio.Reader
	path string
	host string
}

func (w *worker) close() {
	for _, c := range w.conns {
		c.c.Close()
	}
	clear(w.conns)
}

// roundTrip writes rq to url's server on the worker's connection to it
// (dialled on first use, and again after a failure) and reads the answer
// head; the caller reads and closes the body before the next request.
func (w *worker) roundTrip(url, keyHeader string, rq request) (*http.Response, error) {
	c, err := w.conn(url)
	if err != nil {
		return nil, err
	}
	b := w.req[:0]
	b = append(b, "POST "...)
	b = append(b, c.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nContent-Type: application/json\r\nX-User-Id: "...)
	b = append(b, userHeader[rq.user][0]...)
	if rq.key != "" {
		b = append(b, "\r\n"...)
		b = append(b, keyHeader...)
		b = append(b, ": "...)
		b = append(b, rq.key...)
	}
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(rq.body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, rq.body...)
	w.req = b
	_ = c.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.c.Write(b); err != nil {
		w.drop(url)
		return nil, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		w.drop(url)
		return nil, err
	}
	return resp, nil
}

func (w *worker) conn(url string) (*ownConn, error) {
	if c := w.conns[url]; c != nil {
		return c, nil
	}
	hostPort, path, ok := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	if !ok || strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("own connections take http://host/path URLs, got %q", url)
	}
	nc, err := net.DialTimeout("tcp", hostPort, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c := &ownConn{c: nc, r: bufio.NewReaderSize(nc, 16<<10), path: "/" + path, host: hostPort}
	w.conns[url] = c
	return c, nil
}

func (w *worker) drop(url string) {
	if c := w.conns[url]; c != nil {
		c.c.Close()
		delete(w.conns, url)
	}
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
				pool[j] = poolEntry{key: rq.key, user: rq.user, sku: rq.sku, body: rq.body, resp: bytes.Clone(w.buf.Bytes())}
			}
		}()
	}
	wg.Wait()
	return pool, firstErr
}

// percentile is the nearest-rank percentile of sorted durations, in ms.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return float64(sorted[rank]) / 1e6
}

func newClient(conc int) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        0, // no global limit
			MaxIdleConnsPerHost: max(conc, 64) + 16,
			IdleConnTimeout:     2 * time.Minute,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		},
	}
}
