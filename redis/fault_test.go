package idemredis

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/history"
)

// flushDB is the Redis database number of the test that flushes: FLUSHDB
// there empties what its client sees, as FLUSHALL would, without touching
// what other programs keep in the shared Redis.
const flushDB = 15

// fleet is three instances over one database and one Redis (or a proxy
// before it), with their replay caches off: every retry that Redis does not
// answer goes to the database.
type fleet struct {
	b         *testBundle
	instances []*instance
	caches    []*Cache
	logs      []*countingHandler // each cache's log lines

	mu      sync.Mutex
	answers map[string][]answer // by key
	errs    []error

	hist *history.Recorder // every request send made (fault_history_test.go)
}

func newFleet(t *testing.T, b *testBundle, addr string, mode idempotency.Mode) *fleet {
	f := &fleet{b: b, answers: map[string][]answer{}, hist: history.NewRecorder()}
	for range 3 {
		logs := &countingHandler{start: time.Now()}
		c := b.newCache(t, addr, Config{ProbeInterval: 50 * time.Millisecond, Logger: slog.New(logs)})
		f.caches = append(f.caches, c)
		f.logs = append(f.logs, logs)
		f.instances = append(f.instances, b.newInstance(t, c, idempotency.Config{Mode: mode}))
	}
	return f
}

// load sends creates from workers until stop closes: mostly new keys, 30 %
// retries of a recent key, and now and then a new key sent to two instances
// at once; each to a random instance.
func (f *fleet) load(workers int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var recent []string
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, n)
				switch r := rand.IntN(10); {
				case r < 3 && len(recent) > 0:
					key = recent[rand.IntN(len(recent))]
					f.send(key)
				case r == 3:
					var pair sync.WaitGroup
					pair.Go(func() { f.send(key) })
					pair.Go(func() { f.send(key) })
					pair.Wait()
				default:
					f.send(key)
				}
				recent = append(recent, key)
				if len(recent) > 20 {
					recent = recent[1:]
				}
			}
		})
	}
	wg.Wait()
}

func (f *fleet) send(key string) {
	done := f.hist.Begin(history.Request{Key: key, Fingerprint: fleetBody})
	a, err := f.instances[rand.IntN(len(f.instances))].tryPost("u1", key, 5)
	done(historyResponse(a, err))
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.errs = append(f.errs, err)
		return
	}
	f.answers[key] = append(f.answers[key], a)
}

// check: no transport error, no 5xx; every key has at most one order, and
// every 201 for a key carries that order; anything else is in-progress.
func (f *fleet) check(t *testing.T) (requests, replays int) {
	t.Helper()
	require.Empty(t, f.errs)
	orders := map[string]int{}
	rows, err := f.b.db.Query("SELECT idem_key, COUNT(*) FROM test_order WHERE scope = 'u1' GROUP BY idem_key")
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		orders[k] = n
	}
	require.NoError(t, rows.Err())
	for key, answers := range f.answers {
		require.LessOrEqual(t, orders[key], 1, "key %s: duplicate order", key)
		var body string
		for _, a := range answers {
			requests++
			switch {
			case a.status == http.StatusCreated:
				if a.replayed() {
					replays++
				}
				if body == "" {
					body = a.body
				}
				require.Equal(t, body, a.body, "key %s: a wrong replay", key)
				require.Equal(t, 1, orders[key], "key %s: answered 201 without its order", key)
			case a.status == http.StatusConflict && a.problemType() == "in-progress":
			default:
				t.Fatalf("key %s: answered %d %s", key, a.status, a.body)
			}
		}
	}
	f.checkHistory(t)
	return requests, replays
}

func (f *fleet) stats() (s Stats) {
	for _, c := range f.caches {
		cs := c.Stats()
		s.Hits += cs.Hits
		s.Errors += cs.Errors
		s.Skipped += cs.Skipped
		s.Downs += cs.Downs
		s.Ups += cs.Ups
		s.Puts += cs.Puts
		s.Marked += cs.Marked
		s.MarkerHeld += cs.MarkerHeld
		s.Corrupt += cs.Corrupt
	}
	return s
}

// runLoad runs load for d, calling fault at d/3.
func (f *fleet) runLoad(d time.Duration, fault func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { f.load(8, stop); close(done) }()
	time.Sleep(d / 3)
	fault()
	time.Sleep(d - d/3)
	close(stop)
	<-done
}

func TestFault_RedisFlushedMidLoad_NoDuplicateNoWrongReplayNo5xx(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			b := setup(t, flushDB)
			f := newFleet(t, b, redisAddr(), m.mode)
			f.runLoad(1500*time.Millisecond, func() {
				require.NoError(t, b.admin.FlushDB(context.Background()).Err())
			})
			requests, replays := f.check(t)
			t.Logf("%d requests, %d replays; %+v", requests, replays, f.stats())
			require.NotZero(t, f.stats().Hits, "Redis answered no replay at all")
		})
	}
}

// outage is how long the specs keep Redis stopped: several times the
// tests' Timeout, for which calls must fail before an instance marks Redis
// down, even on a starved machine where each instance calls it rarely.
const outage = 1200 * time.Millisecond

func TestFault_RedisStoppedAndRestartedMidLoad_FailsOpen(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		for _, restartEmpty := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart-empty=%v", m.name, restartEmpty), func(t *testing.T) {
				t.Parallel()
				b := setup(t, 0)
				proxy := startProxy(t, redisAddr())
				f := newFleet(t, b, proxy.addr, m.mode)
				f.runLoad(3*time.Second, func() {
					proxy.stop()
					time.Sleep(outage)
					if restartEmpty { // what a restarted Redis without persistence holds
						iter := b.admin.Scan(context.Background(), 0, b.prefix+"*", 1000).Iterator()
						for iter.Next(context.Background()) {
							b.admin.Del(context.Background(), iter.Val())
						}
					}
					proxy.restart(t)
				})
				requests, replays := f.check(t)
				s := f.stats()
				t.Logf("%d requests, %d replays; %+v", requests, replays, s)
				require.NotZero(t, s.Downs, "Redis was never seen down")
				require.NotZero(t, s.Skipped, "calls went on trying a Redis that was down")
				f.requireBackUp(t)
			})
		}
	}
}

// requireBackUp waits until every cache uses Redis again, then checks what
// each logged: one line per change of state, and as many ups as downs. How
// many outages a cache saw is the machine's timing (a loaded machine can
// stall a call past the timeout right after a restart); that the damping
// keeps a restart to one outage is TestHealth_FlappingRestart_OneDownAndOneUp's
// to prove, on an injected clock.
func (f *fleet) requireBackUp(t *testing.T) {
	t.Helper()
	for i, c := range f.caches {
		require.Eventually(t, func() bool {
			c.GetReplay(context.Background(), "u1", "probe")
			return !c.Stats().Down
		}, 5*time.Second, 10*time.Millisecond, "Redis came back but cache %d did not", i)
		s := c.Stats()
		require.Equal(t, int64(s.Downs), f.logs[i].warns.Load(), "cache %d: one line per change to down", i)
		require.Equal(t, int64(s.Ups), f.logs[i].infos.Load(), "cache %d: one line per change to up", i)
		require.Equal(t, s.Downs, s.Ups, "cache %d: ends up, so every down was followed by an up:\n%s", i, f.logs[i])
		t.Logf("cache %d: %d downs, %d ups", i, s.Downs, s.Ups)
	}
}

// TestFault_RedisKilledAndRestartedUnderLoad_EachInstanceGoesDownAndBackOnce
// kills a real redis-server mid-load and starts it again, empty: every
// instance fails open to the database, sees Redis down once and back once
// (Health().Up, what metrics' idempotency_shared_cache_up reads, goes 1, 0,
// 1), and logs two lines.
func TestFault_RedisKilledAndRestartedUnderLoad_EachInstanceGoesDownAndBackOnce(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			server := startRedisServer(t)
			f := newFleet(t, b, server.addr, m.mode)
			var (
				stop    = make(chan struct{})
				sampled sync.WaitGroup
				ups     = make([][]bool, len(f.caches)) // each cache's Health().Up, each change once
			)
			for i, c := range f.caches {
				ups[i] = []bool{c.Health().Up}
				sampled.Go(func() {
					for done := false; !done; {
						select {
						case <-stop:
							done = true // one last look
						case <-time.After(time.Millisecond):
						}
						if up := c.Health().Up; up != ups[i][len(ups[i])-1] {
							ups[i] = append(ups[i], up)
						}
					}
				})
			}
			f.runLoad(3*time.Second, func() {
				server.kill()
				time.Sleep(outage)
				server.start(t)
			})
			requests, replays := f.check(t)
			f.requireBackUp(t)
			close(stop)
			sampled.Wait()
			t.Logf("%d requests, %d replays; %+v", requests, replays, f.stats())
			for i := range f.caches {
				// Up, down, up again. How many outages a loaded machine
				// shows after the restart is timing (see requireBackUp);
				// Health().Up must start and end up and alternate.
				u := ups[i]
				require.True(t, u[0] && u[len(u)-1], "cache %d: starts and ends up: %v\n%s", i, u, f.logs[i])
				require.Contains(t, u, false, "cache %d: Redis was never seen down\n%s", i, f.logs[i])
			}
		})
	}
}

func TestFault_SlowRedis_FailsOpenWithinTheTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	proxy := startProxy(t, redisAddr())
	const timeout = 20 * time.Millisecond
	// Probes at most 400 ms apart, so that Redis is found back soon after the
	// hang ends, however many probes failed during it. The client's own
	// read and write timeouts are a minute: a call bounded by anything but
	// the cache's Timeout would hang that long, which no busy machine's
	// stall could be mistaken for.
	rdb := redis.NewClient(&redis.Options{
		Addr: proxy.addr, DB: b.rdbDB, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	cache, err := New(rdb, &Config{Prefix: b.prefix, Timeout: timeout, ProbeInterval: 200 * time.Millisecond, MaxProbeInterval: 400 * time.Millisecond})
	require.NoError(t, err)
	in := b.newInstance(t, cache, idempotency.Config{})
	ctx := context.Background()
	require.Equal(t, http.StatusCreated, in.post(t, "u1", "warm", 5).status)
	// Redis is up before it hangs. On a loaded machine a call of the warm
	// request can miss the 20 ms timeout and mark it down; the next probe
	// finds it back.
	require.Eventually(t, func() bool {
		cache.GetReplay(ctx, "u1", "warm")
		return !cache.Stats().Down
	}, 30*time.Second, 20*time.Millisecond, "Redis answers, but the cache never marked it up")

	// Two calls in a row fail, each bounded by the cache's 20 ms timeout, not
	// the client's minute, and Redis is marked down.
	proxy.blackhole.Store(true)
	var first time.Duration
	for i := range 2 {
		start := time.Now()
		rec, _ := cache.GetReplay(ctx, "u1", "warm")
		took := time.Since(start)
		first = max(first, took)
		require.Nil(t, rec)
		require.Less(t, took, 10*time.Second, "call %d to a hung Redis: the cache's timeout, not the client's minute", i+1)
	}
	require.True(t, cache.Stats().Down)

	// While it is down, calls skip Redis: none reaches it.
	var rec *idempotency.Record
	before := cache.Stats()
	start := time.Now()
	for range 100 {
		rec, _ = cache.GetReplay(ctx, "u1", "warm")
		require.Nil(t, rec)
	}
	skipped := time.Since(start) / 100
	after := cache.Stats()
	skips, probes := after.Skipped-before.Skipped, after.Errors-before.Errors
	require.Equal(t, uint64(100), skips+probes, "every call while Redis is down skips it, or is a probe")
	probeBound := 1 + uint64(time.Since(start)/(200*time.Millisecond))
	require.LessOrEqual(t, probes, probeBound, "at most one probe per ProbeInterval; %d skipped", skips)

	// Requests meanwhile: answered by the database, at most one Redis
	// timeout each (a probe) on top.
	var worst time.Duration
	for i := range 20 {
		start = time.Now()
		a := in.post(t, "u1", fmt.Sprintf("slow-%d", i), 5)
		worst = max(worst, time.Since(start))
		require.Equal(t, http.StatusCreated, a.status)
		replay := in.post(t, "u1", fmt.Sprintf("slow-%d", i), 5)
		require.True(t, replay.replayed())
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("hung Redis: first calls %v, skipped call %v, worst request %v", first, skipped, worst)

	proxy.blackhole.Store(false)
	require.Eventually(t, func() bool {
		cache.GetReplay(ctx, "u1", "warm")
		return !cache.Stats().Down
	}, 30*time.Second, 20*time.Millisecond, "Redis answers again, but the cache never marked it up")
	// A replay from the database is shared again (tried until no call of the
	// two hits the 20 ms timeout on a loaded machine).
	require.Eventually(t, func() bool {
		if a, err := in.tryPost("u1", "slow-19", 5); err != nil || !a.replayed() {
			return false
		}
		rec, _ := cache.GetReplay(ctx, "u1", "slow-19")
		return rec != nil
	}, 30*time.Second, 20*time.Millisecond, "after Redis recovered, replays are shared again")
}

// countingHandler counts log records by level, and keeps them to show.
type countingHandler struct {
	warns, infos atomic.Int64
	start        time.Time

	mu    sync.Mutex
	lines []string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	} else {
		h.infos.Add(1)
	}
	line := fmt.Sprintf("%v %s %s", r.Time.Sub(h.start).Round(time.Millisecond), r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	h.mu.Lock()
	h.lines = append(h.lines, line)
	h.mu.Unlock()
	return nil
}

func (h *countingHandler) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// hangUntilDown makes Redis behind proxy stop answering and calls it through
// cache until the cache marks it down (two timed-out calls).
func hangUntilDown(t *testing.T, proxy *tcpProxy, cache *Cache) {
	t.Helper()
	proxy.blackhole.Store(true)
	for !cache.Stats().Down {
		cache.GetReplay(context.Background(), "u1", "hang")
	}
}

func TestFault_RedisHungAndMarkedDown_RequestsNoLongerCallIt(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	proxy := startProxy(t, redisAddr())
	// No probe during the spec: every call that reached Redis would time out
	// and count as a fail-open.
	cache := b.newCache(t, proxy.addr, Config{Timeout: 20 * time.Millisecond, ProbeInterval: time.Hour, MaxProbeInterval: time.Hour})
	in := b.newInstance(t, cache, idempotency.Config{})
	require.Equal(t, http.StatusCreated, in.post(t, "u1", "warm", 5).status)

	hangUntilDown(t, proxy, cache)
	before := cache.Stats()
	for i := range 10 {
		key := fmt.Sprintf("k%d", i)
		require.Equal(t, http.StatusCreated, in.post(t, "u1", key, 5).status)
		require.True(t, in.post(t, "u1", key, 5).replayed(), "replayed from the database")
	}
	after := cache.Stats()
	require.Equal(t, before.Errors, after.Errors, "a call went to the hung Redis and timed out")
	require.Equal(t, before.Skipped+20*2, after.Skipped,
		"each request skips its one call before the store (the replay's look-up and the marker) and the replay's write (after its commit, or its read from the database)")
}

func TestFault_MarkerSetBeforeRedisWasMarkedDown_IsStillRemoved(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	proxy := startProxy(t, redisAddr())
	cache := b.newCache(t, proxy.addr, Config{Timeout: testTimeout, ProbeInterval: time.Hour, MaxProbeInterval: time.Hour})
	in := b.newInstance(t, cache, idempotency.Config{})
	release, done := blocked(t, in, "u1", "k1", 5) // its marker is set
	marker := cache.redisKey("m:", "u1", "k1")
	require.EqualValues(t, 1, b.admin.Exists(context.Background(), marker).Val())

	hangUntilDown(t, proxy, cache)
	proxy.blackhole.Store(false) // Redis answers again; the cache does not know yet
	release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	require.True(t, cache.Stats().Down)
	require.Zero(t, b.admin.Exists(context.Background(), marker).Val(),
		"a live owner's marker left behind would answer in-progress for a finished key until its lease ran out")
}
