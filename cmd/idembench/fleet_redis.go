package main

// The fleet family's Redis pre-filter (issue 13): each instance's
// Config.SharedCache is an idemredis.Cache of its own on -redis, and each
// mode has a point where Redis stops halfway through the window, through a
// TCP proxy of ours (the machine's Redis is never touched).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/orderguard/idempotency"
	idemredis "github.com/orderguard/idempotency/redis"
)

// fleetStopRetries is the share of retries of the Redis-stopped points
// (and of quick mode's fleet points).
const fleetStopRetries = 0.20

// fleetRedis is the Redis of the fleet family's Redis variants. Every cache
// writes under a key prefix new to the run, so that entries left by earlier
// runs never answer; close deletes them.
type fleetRedis struct {
	addr   string
	prefix string
	admin  *redis.Client

	mu      sync.Mutex
	clients []*redis.Client
}

// openFleetRedis pings Redis at addr.
func openFleetRedis(ctx context.Context, addr string) (*fleetRedis, error) {
	redis.SetLogger(quietRedisLog{})
	fr := &fleetRedis{addr: addr, admin: newRedisClient(addr, 0)}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := fr.admin.Ping(pctx).Err(); err != nil {
		fr.admin.Close()
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	fr.prefix = "idembench:" + hex.EncodeToString(b[:]) + ":"
	return fr, nil
}

// newRedisClient is a client as idemredis documents it: every call bounded
// by its context (Config.Timeout), no retries; it keeps minIdle connections
// open.
func newRedisClient(addr string, minIdle int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, MinIdleConns: minIdle,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// The fleet's caches are wired as examples/server -redis wires its own
// (examples/server/redis.go): a call timeout that holds on a loaded
// two-core machine, and connections opened before the first request and
// kept idle, so that a first call never dials within its timeout.
const (
	fleetRedisTimeout   = 50 * time.Millisecond
	fleetRedisWarmConns = 4
)

// warmRedis opens n connections to Redis, each answering a PING, and leaves
// them idle in the pool.
func warmRedis(ctx context.Context, rdb *redis.Client, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conns := make([]*redis.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			conns[i] = rdb.Conn()
			errs[i] = conns[i].Ping(ctx).Err()
		})
	}
	wg.Wait()
	for _, c := range conns {
		_ = c.Close()
	}
	return errors.Join(errs...)
}

// quietRedisLog drops go-redis's own log lines, which are one per failed
// dial while Redis is stopped on purpose (idemredis's Stats count the
// failures). go-redis has one logger per process: this silences B5's
// client too.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

// cache is a new idemredis.Cache, with a client of its own, on addr (Redis,
// or a proxy in front of it), its connections opened first.
func (fr *fleetRedis) cache(addr string) (*idemredis.Cache, error) {
	rdb := newRedisClient(addr, fleetRedisWarmConns)
	fr.mu.Lock()
	fr.clients = append(fr.clients, rdb)
	fr.mu.Unlock()
	if err := warmRedis(context.Background(), rdb, fleetRedisWarmConns); err != nil {
		return nil, fmt.Errorf("warm up Redis at %s: %w", addr, err)
	}
	return idemredis.New(rdb, &idemredis.Config{Prefix: fr.prefix, Timeout: fleetRedisTimeout})
}

// close deletes the run's keys and closes every client.
func (fr *fleetRedis) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := fr.admin.Scan(ctx, 0, fr.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			fr.admin.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		fr.admin.Unlink(ctx, keys...)
	}
	if err := iter.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "idembench: delete Redis keys %s*: %v\n", fr.prefix, err)
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, c := range fr.clients {
		c.Close()
	}
	fr.admin.Close()
}

// sharedCounter is the instance's shared cache, marking the request whose
// MarkUnlessReplay (or GetReplay) found an entry, for replaySources. It reports the cache's
// health as the cache does (the middleware reads it: single-phase reads
// the record first after a failed or skipped call).
type sharedCounter struct{ idempotency.SharedCache }

var _ idempotency.SharedCacheHealthReporter = sharedCounter{}

// Health implements idempotency.SharedCacheHealthReporter.
func (s sharedCounter) Health() idempotency.SharedCacheHealth {
	if r, ok := s.SharedCache.(idempotency.SharedCacheHealthReporter); ok {
		return r.Health()
	}
	return idempotency.SharedCacheHealth{Up: true}
}

func (s sharedCounter) GetReplay(ctx context.Context, scope, key string) (*idempotency.Record, time.Duration) {
	rec, ttl := s.SharedCache.GetReplay(ctx, scope, key)
	if m, ok := ctx.Value(marksKey{}).(*requestMarks); ok && rec != nil {
		m.shared.Store(true)
	}
	return rec, ttl
}

func (s sharedCounter) MarkUnlessReplay(ctx context.Context, m idempotency.InFlightMarker, ttl time.Duration) (*idempotency.Record, time.Duration, *idempotency.InFlightMarker, bool) {
	rec, recTTL, held, set := s.SharedCache.MarkUnlessReplay(ctx, m, ttl)
	if marks, ok := ctx.Value(marksKey{}).(*requestMarks); ok && rec != nil {
		marks.shared.Store(true)
	}
	return rec, recTTL, held, set
}

// redisStats sums the caches' counters.
func redisStats(caches []*idemredis.Cache) idemredis.Stats {
	var sum idemredis.Stats
	for _, c := range caches {
		s := c.Stats()
		sum.Hits += s.Hits
		sum.Misses += s.Misses
		sum.Puts += s.Puts
		sum.Errors += s.Errors
		sum.Skipped += s.Skipped
		sum.Downs += s.Downs
	}
	return sum
}

// cutClock files each answer of a window cut in two by the time it came:
// before or after the cut. Workers are numbered 0..conc-1 in a window.
type cutClock struct {
	winStart, winEnd time.Time
	cut              atomic.Int64 // unix ns; 0 until the cut
	sent             []time.Time  // by worker id: when its request left

	mu            sync.Mutex
	before, after []time.Duration
	answers       int64 // every answer, warm-up and overrun included
	errors        int64 // every failed check, warm-up and overrun included
	firstErr      string
}

func (cc *cutClock) wrap(t target) target {
	gen, done := t.gen, t.done
	t.gen = func(w *worker) request {
		cc.sent[w.id] = time.Now()
		return gen(w)
	}
	t.done = func(w *worker, rq request, status int, err error) {
		if done != nil {
			done(w, rq, status, err)
		}
		now := time.Now()
		cc.mu.Lock()
		defer cc.mu.Unlock()
		cc.answers++
		if err != nil {
			cc.errors++
			if cc.firstErr == "" {
				cc.firstErr = fmt.Sprintf("status %d: %v", status, err)
			}
			return
		}
		switch cut := cc.cut.Load(); {
		case now.Before(cc.winStart) || now.After(cc.winEnd):
		case cut == 0 || now.UnixNano() < cut:
			cc.before = append(cc.before, now.Sub(cc.sent[w.id]))
		default:
			cc.after = append(cc.after, now.Sub(cc.sent[w.id]))
		}
	}
	return t
}

// measureRedisStop is a mixed point whose instances reach Redis through
// proxy, stopped halfway through the window: its answers are filed before
// and after the cut. Then, with Redis still down, the same instances
// alternate in slices with the same mix without Redis (plain), as
// measureAgainst alternates B1 with B0: whether throughput falls back to
// the figures without Redis is that ratio, measured side by side. The bare
// create runs half a window before and after. Every answer must pass its
// check (201, or a replay marked and identical to the original): any
// failure fails the run.
func (r *runner) measureRedisStop(client *http.Client, conc int, variant string, bare, plain target, plainProbe func() map[string]float64,
	t target, probe func() map[string]float64, proxy *tcpProxy, caches []*idemredis.Cache) {
	half := r.opts.duration / 2
	short := min(r.opts.warmup, 200*time.Millisecond)
	b0s := []*Point{r.sample(client, probe, famFleet, "B0", "", conc, 0, bare, r.opts.warmup, half)}

	cc := &cutClock{sent: make([]time.Time, conc)}
	cc.winStart = time.Now().Add(r.opts.warmup)
	cc.winEnd = cc.winStart.Add(r.opts.duration)
	timer := time.AfterFunc(r.opts.warmup+half, func() {
		proxy.stop()
		cc.cut.Store(time.Now().UnixNano())
	})
	p := r.sample(client, probe, famFleet, "FS", variant, conc, 0, cc.wrap(t), r.opts.warmup, r.opts.duration)
	timer.Stop()
	proxy.stop() // if the window ended first (interrupted)

	n := r.opts.slices
	if r.opts.quick {
		n = min(n, 2) // quick mode's fleet stays near 20 s
	}
	side := func(probe func() map[string]float64, bench string, t target) sampler {
		return func(warmup, window time.Duration) *Point {
			return r.sample(client, probe, famFleet, bench, "", conc, 0, t, warmup, window)
		}
	}
	nr, down := alternate(n, r.opts.duration, short, side(plainProbe, "F", plain), side(probe, "FS", t))
	b0s = append(b0s, r.sample(client, probe, famFleet, "B0", "", conc, 0, bare, short, half))
	stats := redisStats(caches)

	p0 := r.record(mergePoints(b0s))
	p.Baseline, p.BaselineRPS, p.BaselineP99 = "B0", p0.RPS, p0.P99
	cut := time.Unix(0, cc.cut.Load())
	cc.mu.Lock()
	slices.Sort(cc.before)
	slices.Sort(cc.after)
	p.Kinds = map[string]*KindStat{
		"bare":       kindStat(p0.lat, conc, p0.Seconds),
		"before_cut": kindStat(cc.before, conc, cut.Sub(cc.winStart).Seconds()),
		"after_cut":  kindStat(cc.after, conc, cc.winEnd.Sub(cut).Seconds()),
		"redis_down": kindStat(down.lat, conc, down.Seconds),
		"no_redis":   kindStat(nr.lat, conc, nr.Seconds),
	}
	answers, errs, firstErr := cc.answers, cc.errors, cc.firstErr
	cc.mu.Unlock()
	if p.Server == nil {
		p.Server = map[string]float64{}
	}
	p.Server["answers_all"] = float64(answers)
	p.Server["client_errors_all"] = float64(errs)
	p.Server["redis_down_errors"] = float64(down.Errors)
	p.Server["redis_down_replay_reexecuted"] = down.Server["replay_reexecuted"]
	p.Server["redis_errors_total"] = float64(stats.Errors)
	p.Server["redis_skipped_total"] = float64(stats.Skipped)
	p.Server["redis_downs_total"] = float64(stats.Downs)
	r.record(p)
	k := p.Kinds
	fmt.Fprintf(os.Stderr, "    Redis stopped at half: %d answers, %d client errors; req/s before the cut %.0f, after %.0f; then Redis down %.0f vs no Redis %.0f (%.2f), bare %.0f; Redis: %d failed calls, %d skipped, down %d times\n",
		answers, errs, k["before_cut"].RPS, k["after_cut"].RPS, k["redis_down"].RPS, k["no_redis"].RPS, k["redis_down"].RPS/k["no_redis"].RPS, p0.RPS,
		stats.Errors, stats.Skipped, stats.Downs)
	if errs > 0 || p.Errors > 0 || down.Errors > 0 || nr.Errors > 0 {
		r.fail("fleet %s: %d of %d answers failed their check with Redis stopped mid-run (first: %s), %d with Redis down after it (first: %s); %d without Redis",
			variant, errs, answers, firstErr, down.Errors, down.FirstError, nr.Errors)
	}
}

// redisStopMarkdown writes the Redis-stopped points, if any ran.
func (rep *Report) redisStopMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famFleet && p.Bench == "FS" })
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### Redis stopped mid-run\n\n")
	w("Three fresh instances whose caches reach Redis through a TCP proxy of the benchmark's own; halfway through a window the proxy closes its port and cuts every open connection, as when Redis stops. Then, with Redis still down, the same instances alternate in %v slices with the same mix on the instances without Redis, as B1 alternates with B0: *down / without Redis* is that ratio, measured side by side. Every answer is checked (201, or a replay marked and byte-identical to the first answer), also during the cut; any failure fails the run. Throughput is answers per second; *before* and *after the cut* are the two halves of the window, the second including the fall-back.\n\n", rep.optionsOf("fleet")["slices"])
	w("| mode, retries | answers around the cut | client errors | req/s before the cut | after the cut | Redis down | without Redis | **down / without Redis** | P99 ms down / without Redis | bare req/s | Redis calls failed / skipped |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		k := p.Kinds
		bf, af, dn, nr, bare := k["before_cut"], k["after_cut"], k["redis_down"], k["no_redis"], k["bare"]
		if bf == nil || af == nil || dn == nil || nr == nil || bare == nil || nr.RPS == 0 {
			continue
		}
		w("| %s | %.0f | **%.0f** | %.0f | %.0f | %.0f | %.0f | **%.2f** | %.2f / %.2f | %.0f | %.0f / %.0f |\n",
			strings.TrimSuffix(p.Variant, ", Redis stopped at half"), p.Server["answers_all"], p.Server["client_errors_all"]+p.Server["redis_down_errors"],
			bf.RPS, af.RPS, dn.RPS, nr.RPS, dn.RPS/nr.RPS, dn.P99, nr.P99, bare.RPS,
			p.Server["redis_errors_total"], p.Server["redis_skipped_total"])
	}
	w("\n")
}
