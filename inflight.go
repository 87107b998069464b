package idempotency

import (
	"strconv"
	"sync"
	"time"
)

// Bounds of the backoff between two looks at a key that another attempt is
// executing, in the Store (waitForFinal) or in Config.SharedCache
// (awaitMarker), while a duplicate waits up to Config.InFlightWait.
const (
	firstPoll = 10 * time.Millisecond
	maxPoll   = 250 * time.Millisecond
)

// inflight tracks the keys this instance is executing, so that waiting
// duplicates wake the moment the original finishes instead of polling.
type inflight struct {
	mu      sync.Mutex
	waiters map[string]chan struct{}
}

func inflightKey(scope, key string) string { return strconv.Itoa(len(scope)) + ":" + scope + key }

// begin registers an execution; the returned func wakes its waiters.
func (f *inflight) begin(scope, key string) func() {
	k := inflightKey(scope, key)
	ch := make(chan struct{})
	f.mu.Lock()
	f.waiters[k] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.waiters[k] == ch {
			delete(f.waiters, k)
		}
		f.mu.Unlock()
		close(ch)
	}
}

// wait returns a channel closed when this instance's execution of the key
// ends, or nil (never ready) when the key executes elsewhere.
func (f *inflight) wait(scope, key string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiters[inflightKey(scope, key)]
}
