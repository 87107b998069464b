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
	"encoding/json"
	"mime"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
)

// Default bounds of a Recorder. The check's cost grows with the operations
// of the busiest key, not with the history's length, but the histories stay
// bounded so that a failure's report and visualization stay readable.
const (
	DefaultMaxOperations = 10000
	DefaultMaxKeys       = 4000
)

// Recorder collects the operations of one run. It is safe for concurrent
// use. Keys are admitted while the recorder is under its bounds; once a key
// is admitted every operation on it is recorded, so that the history of each
// recorded key is whole (dropping one operation of a key could hide the
// answer a later replay repeats). Operations on keys that came after the
// bounds were reached are counted, not recorded.
type Recorder struct {
	base          time.Time
	maxOperations int
	maxKeys       int

	mu      sync.Mutex
	ops     []operation
	keys    map[string]bool // admitted
	skipped map[string]bool // seen after the bounds were reached
	dropped int             // operations on skipped keys
}

// operation is one recorded request, its times on the recorder's clock.
type operation struct {
	req       Request
	resp      Response
	call, ret time.Duration
}

// NewRecorder returns a Recorder with the default bounds.
func NewRecorder() *Recorder {
	return NewBoundedRecorder(DefaultMaxOperations, DefaultMaxKeys)
}

// NewBoundedRecorder returns a Recorder that admits new keys while it holds
// fewer than maxOperations operations and maxKeys keys.
func NewBoundedRecorder(maxOperations, maxKeys int) *Recorder {
	return &Recorder{
		base: time.Now(), maxOperations: maxOperations, maxKeys: maxKeys,
		keys: map[string]bool{}, skipped: map[string]bool{},
	}
}

// Begin marks a request's invocation; the returned function records it with
// its answer and the return time. Both times come from the monotonic clock
// that time.Now carries.
func (r *Recorder) Begin(req Request) (done func(Response)) {
	call := time.Now()
	return func(resp Response) { r.Add(req, call, time.Now(), resp) }
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
	if !r.keys[req.Key] {
		if r.skipped[req.Key] || len(r.ops) >= r.maxOperations || len(r.keys) >= r.maxKeys {
			r.skipped[req.Key] = true
			r.dropped++
			return
		}
		r.keys[req.Key] = true
	}
	r.ops = append(r.ops, op)
}

// snapshot returns the recorded operations in invocation order, the
// admitted keys, the skipped keys and the operations dropped with them.
func (r *Recorder) snapshot() (ops []operation, keys, skipped map[string]bool, dropped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops = append([]operation(nil), r.ops...)
	keys, skipped = map[string]bool{}, map[string]bool{}
	for k := range r.keys {
		keys[k] = true
	}
	for k := range r.skipped {
		skipped[k] = true
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].call < ops[j].call })
	if len(ops) > 0 && ops[0].call < 0 { // added after the fact: times from the first call
		first := ops[0].call
		for i := range ops {
			ops[i].call -= first
			ops[i].ret -= first
		}
	}
	return ops, keys, skipped, r.dropped
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
