// Package history records what the clients of a fault spec sent and got
// back, and checks that history with porcupine against a sequential model of
// the HTTP contract (model.go), together with the orders table the run left
// behind. It is for tests only: the fault specs (connection resets, kill -9,
// the lost COMMIT, a Galera node kill, Redis stopped) record every request
// through a Recorder and call Check at the end.
//
// The method follows etcd's tests/robustness: every client operation is
// recorded with its invocation and return times on one monotonic clock; an
// operation that got no answer may have taken effect at any time after it
// was sent; the check is partitioned (here by idempotency key) so that it
// stays cheap; and a failure keeps porcupine's visualization of the history
// for whoever reads the CI log.
package history

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"net/http/httptrace"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
)

// DefaultMaxOperations is how many operations a check covers at most. The
// check's cost grows with the operations of the busiest key more than with
// the history's length, but a bounded history keeps it within seconds and a
// failure's report and visualization readable.
const DefaultMaxOperations = 10000

// keepFactor: a recorder keeps up to this many times its bound, then stops
// admitting keys, so that a long run cannot exhaust memory.
const keepFactor = 10

// Recorder collects the operations of one run. It is safe for concurrent
// use. Every operation on an admitted key is recorded, so that the history
// of each key is whole (dropping one operation of a key could hide the
// answer a later replay repeats). When a run recorded more operations than
// the bound, the check samples whole keys (see sample): every key where
// something happened, and an even share of those answered 201 at once.
type Recorder struct {
	base          time.Time
	maxOperations int

	mu      sync.Mutex
	ops     []operation
	keys    map[string]int  // admitted, in the order they were first sent
	skipped map[string]bool // sent after the recorder was full
	dropped int             // operations on skipped keys
}

// operation is one recorded request, its times on the recorder's clock.
type operation struct {
	req       Request
	resp      Response
	call, ret time.Duration
}

// NewRecorder returns a Recorder whose check covers at most
// DefaultMaxOperations operations.
func NewRecorder() *Recorder { return NewBoundedRecorder(DefaultMaxOperations) }

// NewBoundedRecorder returns a Recorder whose check covers at most about
// maxOperations operations.
func NewBoundedRecorder(maxOperations int) *Recorder {
	return &Recorder{base: time.Now(), maxOperations: maxOperations, keys: map[string]int{}, skipped: map[string]bool{}}
}

// Begin marks a request's invocation; the returned function records it with
// its answer and the return time. Both times come from the monotonic clock
// that time.Now carries.
func (r *Recorder) Begin(req Request) (done func(Response)) {
	call := time.Now()
	return func(resp Response) { r.Add(req, call, time.Now(), resp) }
}

// BeginHTTP is Begin for a request net/http sends with the returned
// context. net/http's Transport sends a request that carries an
// Idempotency-Key again, on a new connection, when a reused connection fails
// before the answer (a server killed mid-request): the client sees one call,
// the server may have seen two. The context's trace sees every connection
// the request is sent on, and each attempt but the last is recorded as an
// operation without an answer, whose outcome is unknown.
func (r *Recorder) BeginHTTP(ctx context.Context, req Request) (context.Context, func(Response)) {
	call := time.Now()
	var (
		mu    sync.Mutex
		sends []time.Time // when each connection was got, the first included
	)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {
		mu.Lock()
		sends = append(sends, time.Now())
		mu.Unlock()
	}})
	return ctx, func(resp Response) {
		ret := time.Now()
		mu.Lock()
		defer mu.Unlock()
		start := call
		for _, again := range sends[min(1, len(sends)):] {
			r.Add(req, start, again, Response{Err: "net/http sent the request again on a new connection"})
			start = again
		}
		r.Add(req, start, ret, resp)
	}
}

// Add records a request invoked at call that returned resp at ret. call and
// ret must come from time.Now (they carry its monotonic reading).
func (r *Recorder) Add(req Request, call, ret time.Time, resp Response) {
	op := operation{req: req, resp: resp, call: call.Sub(r.base), ret: ret.Sub(r.base)}
	if op.ret < op.call {
		op.ret = op.call
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.keys[req.Key]; !ok {
		if r.skipped[req.Key] || len(r.ops) >= keepFactor*r.maxOperations {
			r.skipped[req.Key] = true
			r.dropped++
			return
		}
		r.keys[req.Key] = len(r.keys)
	}
	r.ops = append(r.ops, op)
}

// sample returns the operations the check covers, in invocation order, and
// the keys checked and left unchecked (sampled out, or sent after the
// recorder was full) with the operations left out. Over the bound it checks
// every key whose history holds more than one plain 2xx (a retry, a fault,
// a replay, a refusal: where the contract can break) and one in stride of
// the others, spread over the run; if those keys alone exceed the bound,
// one in stride of all keys.
func (r *Recorder) sample() (ops []operation, checked, unchecked map[string]bool, dropped, stride int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	perKey := map[string]int{}
	eventful := map[string]bool{}
	for _, op := range r.ops {
		perKey[op.req.Key]++
		p := op.resp
		if perKey[op.req.Key] > 1 || p.Err != "" || p.Replayed || p.Problem != "" || p.Status < 200 || p.Status >= 300 {
			eventful[op.req.Key] = true
		}
	}
	eventfulOps := 0
	for k := range eventful {
		eventfulOps += perKey[k]
	}
	plain := len(r.ops) - eventfulOps // one operation per plain key
	stride = 1
	keep := func(k string, i int) bool { return eventful[k] || i%stride == 0 }
	switch {
	case len(r.ops) <= r.maxOperations:
	case eventfulOps < r.maxOperations:
		stride = (plain + r.maxOperations - eventfulOps - 1) / (r.maxOperations - eventfulOps)
		plainIndex := map[string]int{}
		for k, i := range r.keys {
			if !eventful[k] {
				plainIndex[k] = i
			}
		}
		keep = func(k string, _ int) bool { return eventful[k] || plainIndex[k]%stride == 0 }
	default:
		stride = (len(r.ops) + r.maxOperations - 1) / r.maxOperations
		keep = func(_ string, i int) bool { return i%stride == 0 }
	}
	checked, unchecked, dropped = map[string]bool{}, map[string]bool{}, r.dropped
	for k, i := range r.keys {
		if keep(k, i) {
			checked[k] = true
		} else {
			unchecked[k] = true
		}
	}
	for k := range r.skipped {
		unchecked[k] = true
	}
	for _, op := range r.ops {
		if checked[op.req.Key] {
			ops = append(ops, op)
		} else {
			dropped++
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].call < ops[j].call })
	if len(ops) > 0 && ops[0].call < 0 { // added after the fact: times from the first call
		first := ops[0].call
		for i := range ops {
			ops[i].call -= first
			ops[i].ret -= first
		}
	}
	return ops, checked, unchecked, dropped, stride
}

// Answer is the Response for an HTTP answer: status, body, the
// Idempotent-Replayed and Retry-After headers, and the kind of a problem
// (application/problem+json) answer.
func Answer(status int, header http.Header, body []byte) Response {
	r := Response{
		Status: status, Body: string(body),
		Replayed:   header.Get("Idempotent-Replayed") == "true",
		RetryAfter: header.Get("Retry-After"),
	}
	if mt, _, _ := mime.ParseMediaType(header.Get("Content-Type")); mt == "application/problem+json" {
		var p struct{ Type string }
		if json.Unmarshal(body, &p) == nil {
			r.Problem = strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
		}
	}
	return r
}

// Failed is the Response for a request that got no answer.
func Failed(err error) Response {
	if err == nil {
		return Response{Err: "no answer"}
	}
	return Response{Err: err.Error()}
}
