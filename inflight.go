package idempotency

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the backoff between two looks at a key that another attempt is
// executing, in the Store (waitForFinal) or in Config.SharedCache
// (awaitMarker), while a duplicate waits up to Config.InFlightWait.
const (
	firstPoll = 10 * time.Millisecond
	maxPoll   = 250 * time.Millisecond
)

// waitContext bounds the attempt's waits for another attempt's outcome, in
// the shared cache and then in the Store, by one InFlightWait in all from
// the first of them, and by the request.
func (a *attempt) waitContext() (context.Context, context.CancelFunc) {
	if a.waitUntil.IsZero() {
		a.waitUntil = time.Now().Add(a.m.cfg.InFlightWait)
	}
	return context.WithDeadline(a.ctx, a.waitUntil)
}

// nextLook waits for the next look at a key another attempt is executing:
// at once when that attempt runs on this instance and answers, else after
// *poll, which it doubles for the next time, up to maxPoll. It reports
// false when ctx ended first.
func (a *attempt) nextLook(ctx context.Context, poll *time.Duration) bool {
	timer := time.NewTimer(*poll)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-a.m.inflight.wait(a.scope, a.key):
	case <-timer.C:
		*poll = min(2**poll, maxPoll)
	}
	return true
}

// inflight tracks the keys this instance is executing, so that waiting
// duplicates wake the moment the original finishes instead of polling.
type inflight struct {
	mu      sync.Mutex
	waiters map[string]chan struct{}
	// twins counts single-phase attempts waiting for a twin's execution
	// on this instance (awaitTwin): a hook for the specs.
	twins atomic.Int64
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

// enter registers an execution of the key unless this instance executes
// it already: then it returns that execution's channel, closed when it
// ends, and no done func.
func (f *inflight) enter(scope, key string) (running <-chan struct{}, done func()) {
	k := inflightKey(scope, key)
	f.mu.Lock()
	if ch, ok := f.waiters[k]; ok {
		f.mu.Unlock()
		return ch, nil
	}
	f.mu.Unlock()
	return nil, f.begin(scope, key)
}

// wait returns a channel closed when this instance's execution of the key
// ends, or nil (never ready) when the key executes elsewhere.
func (f *inflight) wait(scope, key string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiters[inflightKey(scope, key)]
}
