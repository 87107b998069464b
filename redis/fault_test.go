package idemredis

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
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

	mu      sync.Mutex
	answers map[string][]answer // by key
	errs    []error
}

func newFleet(t *testing.T, b *testBundle, addr string, mode idempotency.Mode, logger *slog.Logger) *fleet {
	f := &fleet{b: b, answers: map[string][]answer{}}
	for range 3 {
		c := b.newCache(t, addr, Config{ProbeInterval: 50 * time.Millisecond, Logger: logger})
		f.caches = append(f.caches, c)
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
	a, err := f.instances[rand.IntN(len(f.instances))].tryPost("u1", key, 5)
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
	return requests, replays
}

func (f *fleet) stats() (s Stats) {
	for _, c := range f.caches {
		cs := c.Stats()
		s.Hits += cs.Hits
		s.Errors += cs.Errors
		s.Skipped += cs.Skipped
		s.Downs += cs.Downs
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
			f := newFleet(t, b, redisAddr(), m.mode, nil)
			f.runLoad(1500*time.Millisecond, func() {
				require.NoError(t, b.admin.FlushDB(context.Background()).Err())
			})
			requests, replays := f.check(t)
			t.Logf("%d requests, %d replays; %+v", requests, replays, f.stats())
			require.NotZero(t, f.stats().Hits, "Redis answered no replay at all")
		})
	}
}

func TestFault_RedisStoppedAndRestartedMidLoad_FailsOpen(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		for _, restartEmpty := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart-empty=%v", m.name, restartEmpty), func(t *testing.T) {
				t.Parallel()
				b := setup(t, 0)
				proxy := startProxy(t, redisAddr())
				logs := &countingHandler{}
				f := newFleet(t, b, proxy.addr, m.mode, slog.New(logs))
				f.runLoad(2*time.Second, func() {
					proxy.stop()
					time.Sleep(600 * time.Millisecond)
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
				t.Logf("%d requests, %d replays; %+v; logged %d down, %d up", requests, replays, s, logs.warns.Load(), logs.infos.Load())
				require.NotZero(t, s.Downs, "Redis was never seen down")
				require.NotZero(t, s.Skipped, "calls went on trying a Redis that was down")
				require.Equal(t, int64(s.Downs), logs.warns.Load(), "one line per change to down")
				require.NotZero(t, logs.infos.Load())
				require.LessOrEqual(t, logs.infos.Load(), logs.warns.Load(), "one line per change to up")
				for _, c := range f.caches {
					require.Eventually(t, func() bool {
						c.GetReplay(context.Background(), "u1", "probe")
						return !c.Stats().Down
					}, 2*time.Second, 10*time.Millisecond, "Redis came back but the cache did not")
				}
			})
		}
	}
}

func TestFault_SlowRedis_FailsOpenWithinTheTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	proxy := startProxy(t, redisAddr())
	const timeout = 20 * time.Millisecond
	cache := b.newCache(t, proxy.addr, Config{Timeout: timeout, ProbeInterval: 200 * time.Millisecond})
	in := b.newInstance(t, cache, idempotency.Config{})
	ctx := context.Background()
	require.Equal(t, http.StatusCreated, in.post(t, "u1", "warm", 5).status)
	require.False(t, cache.Stats().Down)

	proxy.blackhole.Store(true)
	start := time.Now()
	rec, _ := cache.GetReplay(ctx, "u1", "warm")
	first := time.Since(start)
	require.Nil(t, rec)
	require.True(t, cache.Stats().Down)
	require.Less(t, first, timeout+15*time.Millisecond, "the first call to a hung Redis")

	start = time.Now()
	for range 100 {
		rec, _ = cache.GetReplay(ctx, "u1", "warm")
		require.Nil(t, rec)
	}
	skipped := time.Since(start) / 100
	require.Less(t, skipped, time.Millisecond, "calls while Redis is down")

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
	t.Logf("hung Redis: first call %v, skipped call %v, worst request %v", first, skipped, worst)

	proxy.blackhole.Store(false)
	require.Eventually(t, func() bool {
		cache.GetReplay(ctx, "u1", "warm")
		return !cache.Stats().Down
	}, 3*time.Second, 20*time.Millisecond)
	require.True(t, in.post(t, "u1", "slow-19", 5).replayed()) // from the database, which shares it
	rec, _ = cache.GetReplay(ctx, "u1", "slow-19")
	require.NotNil(t, rec, "after Redis recovered, replays are shared again")
}

// countingHandler counts log records by level.
type countingHandler struct{ warns, infos atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	} else {
		h.infos.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
