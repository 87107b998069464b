package idemredis

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// health decides whether a call may go to Redis and learns from how calls
// end, so that an outage costs a request at most a timeout or two, a Redis
// that is back is used again, and the state does not flap (each change is
// logged).
//
// Up, every call goes. Redis is marked down once calls have failed, with no
// answer in between, for at least downAfter (Config.Timeout): one slow call
// among answers, or a burst of calls that a pause of this process timed out
// together, is not an outage. Down, calls skip Redis until the backoff has
// passed; then one call, the probe, tries it. Only a probe's answer marks
// Redis up. A failed probe doubles the backoff, up to maxBackoff, and so
// does going down again less than maxBackoff after coming up: a Redis that
// keeps failing right after it answers is tried less and less often. Only
// calls that began in the current state count: a call that began before a
// change of state (a reply in flight when Redis stopped, a timeout on a
// connection from before a restart) ends with news about the past.
//
// Its methods take the time, so that tests drive it with fixed instants.
type health struct {
	probeInterval, maxBackoff, downAfter time.Duration
	base                                 time.Time // nextProbe's origin

	// epoch counts changes of state: even while up, odd while down. A call
	// carries the epoch it began in.
	epoch     atomic.Uint64
	nextProbe atomic.Int64 // down: when the next probe may go, in nanoseconds since base
	failing   atomic.Bool  // up: calls have failed since the last answer

	mu          sync.Mutex    // changes of state, and what decides them
	streakStart time.Time     // up: the first failure since the last answer
	since       time.Time     // when the current state began
	backoff     time.Duration // down: how long each probe waits for the last

	failOpens, skipped, downs, ups atomic.Uint64
}

func newHealth(probeInterval, maxBackoff, downAfter time.Duration, now time.Time) *health {
	return &health{probeInterval: probeInterval, maxBackoff: maxBackoff, downAfter: downAfter, base: now, since: now}
}

// call is one call to Redis, from begin to end.
type call struct {
	epoch uint64
	probe bool // began while Redis was down: its answer marks it up
}

// result is how a call ended.
type result int

const (
	answered result = iota // a reply, or nil (redis.Nil)
	refused                // an error reply: Redis is reachable, the call failed
	failed                 // no reply: a network error or the timeout
)

// classify tells how a call that returned err ended.
func classify(err error) result {
	var reply redis.Error
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return answered
	case errors.As(err, &reply):
		return refused
	}
	return failed
}

// change is a change of state that a call's end made, for the caller to log
// once.
type change struct {
	down, up bool
	lasted   time.Duration // how long the state before it lasted
	backoff  time.Duration // down: how long calls skip Redis before the first probe
}

// begin reports whether a call may go to Redis at now: always while it is
// up; while it is down, one call, the probe, once the backoff has passed.
// The others are skipped, at the cost of two atomic loads.
func (h *health) begin(now time.Time) (call, bool) {
	e := h.epoch.Load()
	if e%2 == 0 {
		return call{epoch: e}, true
	}
	if h.offset(now) < h.nextProbe.Load() {
		h.skipped.Add(1)
		return call{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e = h.epoch.Load()
	switch {
	case e%2 == 0:
		return call{epoch: e}, true
	case h.offset(now) < h.nextProbe.Load():
		h.skipped.Add(1)
		return call{}, false
	}
	h.nextProbe.Store(h.offset(now.Add(h.backoff))) // no other probe meanwhile
	return call{epoch: e, probe: true}, true
}

// current is a call that goes to Redis whatever its state (a marker's
// removal): it counts while Redis is up, and its answer while down is not a
// probe's.
func (h *health) current() call { return call{epoch: h.epoch.Load()} }

// end records how c ended at now, and returns the change of state it made.
func (h *health) end(c call, now time.Time, r result) change {
	if r != answered {
		h.failOpens.Add(1)
	}
	e := h.epoch.Load()
	switch {
	case c.epoch != e: // news about the past
		return change{}
	case e%2 == 0 && r != failed && !h.failing.Load(): // up, and still answering: the common case
		return change{}
	case e%2 == 1 && !c.probe:
		return change{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch.Load() != e {
		return change{}
	}
	if e%2 == 1 { // a probe's end
		if r == answered {
			return h.up(now)
		}
		h.backoff = min(2*h.backoff, h.maxBackoff)
		h.nextProbe.Store(h.offset(now.Add(h.backoff)))
		return change{}
	}
	switch {
	case r != failed: // Redis answered: the streak of failures ends
		h.failing.Store(false)
		return change{}
	case !h.failing.Load():
		h.failing.Store(true)
		h.streakStart = now
	}
	if now.Sub(h.streakStart) < h.downAfter {
		return change{}
	}
	return h.down(now)
}

// down marks Redis down at now; the caller holds mu.
func (h *health) down(now time.Time) change {
	lasted := now.Sub(h.since)
	if h.backoff == 0 || lasted >= h.maxBackoff {
		h.backoff = h.probeInterval
	} else { // back up only briefly: a flap
		h.backoff = min(2*h.backoff, h.maxBackoff)
	}
	h.nextProbe.Store(h.offset(now.Add(h.backoff))) // before the epoch: begin reads them in the other order
	h.failing.Store(false)
	h.since = now
	h.downs.Add(1)
	h.epoch.Add(1)
	return change{down: true, lasted: lasted, backoff: h.backoff}
}

// up marks Redis up at now; the caller holds mu.
func (h *health) up(now time.Time) change {
	lasted := now.Sub(h.since)
	h.since = now
	h.ups.Add(1)
	h.epoch.Add(1)
	return change{up: true, lasted: lasted}
}

// isUp reports whether calls go to Redis.
func (h *health) isUp() bool { return h.epoch.Load()%2 == 0 }

// offset is t in nanoseconds since base (monotonic when both are).
func (h *health) offset(t time.Time) int64 { return int64(t.Sub(h.base)) }
