package idemredis

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The health specs run on fixed instants: t0 plus milliseconds.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// newTestHealth probes 100 ms after going down, backs off to at most 800 ms,
// and goes down after 20 ms of failures (the Timeout).
func newTestHealth() *health {
	return newHealth(100*time.Millisecond, 800*time.Millisecond, 20*time.Millisecond, t0)
}

// mustBegin begins a call that must be let through.
func mustBegin(t *testing.T, h *health, at time.Time) call {
	t.Helper()
	c, ok := h.begin(at)
	require.True(t, ok, "a call at %v was skipped", at.Sub(t0))
	return c
}

// goDown fails calls from at until Redis is marked down, and returns when.
func goDown(t *testing.T, h *health, at time.Time) time.Time {
	t.Helper()
	require.True(t, h.isUp())
	h.end(mustBegin(t, h, at), at, failed)
	at = at.Add(h.downAfter)
	require.True(t, h.end(mustBegin(t, h, at), at, failed).down)
	return at
}

func TestHealth_FailuresForTheTimeoutWithNoAnswerBetween_MarkRedisDown(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	require.Zero(t, h.end(mustBegin(t, h, ms(20)), ms(20), failed), "one failure is not an outage")
	require.Zero(t, h.end(mustBegin(t, h, ms(30)), ms(30), failed), "10 ms of failures are not either")
	ch := h.end(mustBegin(t, h, ms(40)), ms(40), failed)
	require.Equal(t, change{down: true, lasted: 40 * time.Millisecond, backoff: 100 * time.Millisecond}, ch)
	require.False(t, h.isUp())
	require.Equal(t, uint64(3), h.failOpens.Load())
	require.Equal(t, uint64(1), h.downs.Load())
}

func TestHealth_StrayFailuresAmongAnswers_AreNotAnOutage(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	// A loaded host: now and then a call times out, between answers, for
	// far longer than the Timeout in all; and a pause of this process times
	// out ten calls at once.
	for i := range 50 {
		at := ms(100 * i)
		if i%3 == 0 {
			require.Zero(t, h.end(mustBegin(t, h, at), at, failed))
		} else {
			require.Zero(t, h.end(mustBegin(t, h, at), at, answered))
		}
	}
	var paused []call
	for range 10 {
		paused = append(paused, mustBegin(t, h, ms(6000)))
	}
	for i, c := range paused {
		require.Zero(t, h.end(c, ms(6030+i/5), failed), "a burst of timeouts within 1 ms")
	}
	require.True(t, h.isUp())
	require.Zero(t, h.downs.Load())
	require.Equal(t, uint64(17+10), h.failOpens.Load(), "each failure is still a fail-open")
}

func TestHealth_ErrorReplies_AreFailOpensNeverAnOutage(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	for i := range 10 {
		require.Zero(t, h.end(mustBegin(t, h, ms(100*i)), ms(100*i), refused))
	}
	require.True(t, h.isUp(), "Redis answered, if with errors (OOM, LOADING)")
	require.Equal(t, uint64(10), h.failOpens.Load())

	h.end(mustBegin(t, h, ms(1000)), ms(1000), failed)
	h.end(mustBegin(t, h, ms(1010)), ms(1010), refused)
	require.Zero(t, h.end(mustBegin(t, h, ms(1030)), ms(1030), failed), "an error reply ends a streak of failures")
	require.True(t, h.isUp())
}

func TestHealth_Down_CallsSkipRedisUntilTheBackoff_ThenOneProbe(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	down := goDown(t, h, ms(0)) // 20 ms; the first probe at 120 ms
	for at := down; at.Before(ms(120)); at = at.Add(10 * time.Millisecond) {
		_, ok := h.begin(at)
		require.False(t, ok, "a call at %v went to a Redis that is down", at.Sub(t0))
	}
	probe := mustBegin(t, h, ms(120))
	require.True(t, probe.probe)
	_, ok := h.begin(ms(121))
	require.False(t, ok, "one probe at a time")
	require.Equal(t, uint64(11), h.skipped.Load())
	require.False(t, h.isUp(), "a probe in flight proves nothing yet")
}

func TestHealth_OnlyAProbesAnswerMarksRedisUp(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	inFlight := mustBegin(t, h, ms(5)) // began while Redis was up
	down := goDown(t, h, ms(0))

	require.Zero(t, h.end(inFlight, down.Add(time.Millisecond), answered), "an answer to a call from before the outage")
	require.Zero(t, h.end(h.current(), down.Add(2*time.Millisecond), answered), "an answer to a marker's removal, tried while down")
	require.False(t, h.isUp())

	probe := mustBegin(t, h, ms(120))
	ch := h.end(probe, ms(121), answered)
	require.Equal(t, change{up: true, lasted: 101 * time.Millisecond}, ch)
	require.True(t, h.isUp())
	require.Equal(t, uint64(1), h.ups.Load())
}

func TestHealth_FailedProbes_DoubleTheBackoffUpToMaxProbeInterval(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	at := goDown(t, h, ms(0)).Add(100 * time.Millisecond)
	for _, wait := range []int{200, 400, 800, 800, 800} {
		probe := mustBegin(t, h, at)
		require.True(t, probe.probe)
		require.Zero(t, h.end(probe, at, failed))
		_, ok := h.begin(at.Add(time.Duration(wait-1) * time.Millisecond))
		require.False(t, ok, "probed before %d ms", wait)
		at = at.Add(time.Duration(wait) * time.Millisecond)
	}
	require.True(t, h.end(mustBegin(t, h, at), at, answered).up)
	require.Equal(t, uint64(1), h.downs.Load(), "one outage, however many probes failed")
}

func TestHealth_DownAgainSoonAfterComingBack_BacksOffLonger_UntilUpForMaxProbeInterval(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	back := func(at time.Time) time.Time {
		t.Helper()
		probe := mustBegin(t, h, at)
		require.True(t, h.end(probe, at, answered).up)
		return at
	}
	down := goDown(t, h, ms(0))
	require.Equal(t, 100*time.Millisecond, h.backoff)
	up := back(down.Add(100 * time.Millisecond))

	// Flaps: down again 50 ms after each return.
	for _, want := range []time.Duration{200, 400, 800, 800} {
		down = goDown(t, h, up.Add(30*time.Millisecond))
		require.Equal(t, want*time.Millisecond, h.backoff)
		up = back(down.Add(h.backoff))
	}
	// Up for MaxProbeInterval: the next outage is a new one.
	down = goDown(t, h, up.Add(800*time.Millisecond))
	require.Equal(t, 100*time.Millisecond, h.backoff)
}

func TestHealth_FailuresOfCallsFromBeforeAChange_DoNotCount(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	stale := []call{mustBegin(t, h, ms(1)), mustBegin(t, h, ms(2))} // on connections that a restart will cut
	goDown(t, h, ms(0))
	up := ms(120)
	require.True(t, h.end(mustBegin(t, h, up), up, answered).up)

	require.Zero(t, h.end(stale[0], up.Add(time.Millisecond), failed))
	require.Zero(t, h.end(stale[1], up.Add(50*time.Millisecond), failed))
	require.True(t, h.isUp(), "failures of calls that began before Redis came back")
	require.False(t, h.failing.Load())
}

// A restart as the fleet specs saw it before damping: answers and timeouts
// of calls from before the outage, and stray timeouts among answers once
// Redis was back, flipped the state each time.
func TestHealth_FlappingRestart_OneDownAndOneUp(t *testing.T) {
	t.Parallel()
	h := newTestHealth()
	var changes []change
	end := func(c call, at time.Time, r result) {
		if ch := h.end(c, at, r); ch.down || ch.up {
			changes = append(changes, ch)
		}
	}
	// Under load, calls begin every millisecond; forty are still in flight
	// when Redis stops at 100 ms.
	var inFlight []call
	for i := range 100 {
		c := mustBegin(t, h, ms(i))
		if i < 60 {
			end(c, ms(i+1), answered)
		} else {
			inFlight = append(inFlight, c)
		}
	}
	// Stopped: every new call fails until Redis is back at 400 ms. Half the
	// calls in flight end meanwhile, their replies already on the way or
	// cut, one of them late into the outage; the others end after the
	// restart.
	stale := inFlight[21:]
	for i := 100; i < 400; i++ {
		if k := i - 100; k < 40 && k%2 == 0 {
			end(inFlight[k/2], ms(i), []result{answered, failed}[k/2%2])
		}
		if i == 250 {
			end(inFlight[20], ms(i), answered)
		}
		if c, ok := h.begin(ms(i)); ok {
			end(c, ms(i), failed)
		}
	}
	// Back: the calls from before the stop end now, answered or timed out
	// on connections the restart cut; new calls mostly answer, one in seven
	// times out.
	for i, c := range stale {
		end(c, ms(400+i), []result{answered, failed}[i%2])
	}
	for i := 400; i < 3000; i++ {
		c, ok := h.begin(ms(i))
		if !ok {
			continue
		}
		r := answered
		if i%7 == 0 {
			r = failed
		}
		end(c, ms(i), r)
	}
	require.Len(t, changes, 2, "state changes, each logged: %+v", changes)
	require.True(t, changes[0].down)
	require.True(t, changes[1].up)
	require.True(t, h.isUp())
}

func TestClassify_AnswersErrorRepliesAndNetworkFailures(t *testing.T) {
	t.Parallel()
	require.Equal(t, answered, classify(nil))
	require.Equal(t, answered, classify(redis.Nil), "no such key is an answer")
	require.Equal(t, failed, classify(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}))
	require.Equal(t, failed, classify(context.DeadlineExceeded))

	requireRedis(t)
	err := newRedisClient(t, redisAddr(), 0).Do(context.Background(), "NO-SUCH-COMMAND").Err()
	require.Error(t, err)
	require.Equal(t, refused, classify(err), "an error reply: %v", err)
}

// manualClock is a clock the test moves.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Real Redis behind a proxy, the health state machine on a clock the test
// moves: the backoff, not the wall clock, decides when Redis is tried again.
func TestHealth_RealRedisStoppedAndBack_SkippedUntilTheBackoffThenAProbeMarksItUp(t *testing.T) {
	t.Parallel()
	requireRedis(t)
	proxy := startProxy(t, redisAddr())
	clock := &manualClock{now: t0}
	logs := &countingHandler{start: time.Now()}
	cfg := Config{Timeout: testTimeout, ProbeInterval: time.Second, MaxProbeInterval: 8 * time.Second, Logger: slog.New(logs)}.withDefaults()
	cache := newCache(newRedisClient(t, proxy.addr, 0), cfg, clock.Now)
	get := func(at time.Time) {
		clock.set(at)
		cache.GetReplay(context.Background(), "u1", "k")
	}
	outage := func(at time.Time) time.Time {
		t.Helper()
		proxy.stop()
		get(at)
		get(at.Add(testTimeout)) // failed for Timeout: down
		require.True(t, cache.Stats().Down)
		proxy.restart(t)
		return at.Add(testTimeout)
	}

	down := outage(ms(0))
	before := cache.Stats()
	get(down.Add(999 * time.Millisecond))
	require.Equal(t, before.Skipped+1, cache.Stats().Skipped, "Redis is back, but the backoff has not passed")
	require.Equal(t, before.Errors, cache.Stats().Errors)
	get(down.Add(time.Second)) // the probe
	require.False(t, cache.Stats().Down)

	// Down again 100 ms later: a flap, so the next probe waits 2 s.
	down = outage(down.Add(1100 * time.Millisecond))
	get(down.Add(1999 * time.Millisecond))
	require.True(t, cache.Stats().Down)
	get(down.Add(2 * time.Second))
	require.False(t, cache.Stats().Down)

	s := cache.Stats()
	require.Equal(t, uint64(2), s.Downs)
	require.Equal(t, uint64(2), s.Ups)
	require.Equal(t, int64(2), logs.warns.Load(), "one line per change to down:\n%s", logs)
	require.Equal(t, int64(2), logs.infos.Load(), "one line per change to up:\n%s", logs)
	h := cache.Health()
	require.Equal(t, idempotency.SharedCacheHealth{Up: true, FailOpens: 4, Skipped: 2, Downs: 2, Ups: 2}, h)
}
