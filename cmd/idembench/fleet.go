package main

// The fleet family (issue 13): three instances of the example order service
// on one MariaDB database, each with its own *sql.DB, store and replay
// cache, as three processes behind a load balancer would be. The load
// generator sends every request to an instance picked at random, with an
// agent-shaped workload: mostly new keys, plus retries of recently answered
// keys (5 % and 20 %), which land on any instance, so two retries in three
// miss the cache of the instance that served the original.
//
// Each mixed point alternates in slices with the bare create (the same three
// instances' unprotected handlers), and its new keys and replays are
// reported apart, each as a ratio to the bare create, with where each
// replay was answered from (a counting Observer: Event.From, a hit of the
// shared cache, and a StageExecute before the replay for a re-execution).
// Every mixed point runs without and with the Redis pre-filter
// (Config.SharedCache, fleet_redis.go), and each mode has a point where
// Redis stops in the middle of the window.

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemredis "github.com/orderguard/idempotency/redis"
)

const (
	famFleet       = "fleet-3i"
	fleetInstances = 3
	// fleetRecent is how many of the latest answered new keys a retry picks
	// from: an agent retries what it sent moments ago.
	fleetRecent = 1024
)

// fleetRetryShares are the mixed points' shares of retries.
var fleetRetryShares = []float64{0.05, 0.20}

// KindStat is one kind of request within a mixed point.
type KindStat struct {
	Requests int     `json:"requests"`
	RPS      float64 `json:"rps"` // answers of this kind per second of the window
	// EquivRPS is concurrency / mean latency: by Little's law the
	// throughput of a closed loop sending only this kind at the latencies
	// it had in the mix. Over the bare create's (its own concurrency /
	// mean latency) it is the kind's throughput ratio.
	EquivRPS float64 `json:"equiv_rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Mean     float64 `json:"mean_ms"`
}

// fleetMix is the agent-shaped workload over several instances.
type fleetMix struct {
	urls  []string
	retry float64

	mu     sync.Mutex
	recent []poolEntry // ring of the latest answered new keys
	n      int
}

func (m *fleetMix) gen(w *worker) request {
	url := m.urls[rand.IntN(len(m.urls))]
	if rand.Float64() < m.retry {
		m.mu.Lock()
		var e poolEntry
		if m.n > 0 {
			e = m.recent[rand.IntN(min(m.n, len(m.recent)))]
		}
		m.mu.Unlock()
		if e.key != "" {
			return request{key: e.key, user: e.user, body: e.body, want: e.resp, url: url, kind: kindReplay}
		}
	}
	rq := genNewKey(w)
	rq.url, rq.kind = url, kindNew
	return rq
}

// done remembers every new key answered as asked, for retries.
func (m *fleetMix) done(w *worker, rq request, status int, err error) {
	if err != nil || rq.kind != kindNew {
		return
	}
	e := poolEntry{key: rq.key, user: rq.user, body: rq.body, resp: bytes.Clone(w.buf.Bytes())}
	m.mu.Lock()
	m.recent[m.n%len(m.recent)] = e
	m.n++
	m.mu.Unlock()
}

// replaySources counts where the create route's replays were answered from:
// this instance's replay cache (Event.From), the shared cache (Redis: the
// request's GetReplay found the entry, sharedCounter), the store after a
// read, or the store after an execution that collided and rolled back (a
// StageExecute began in the same request). It is both Observer and
// StageObserver.
type replaySources struct {
	cache, shared, store, reexec, executed atomic.Int64
}

type requestMarks struct{ executed, shared atomic.Bool }

type marksKey struct{}

func (s *replaySources) StartStage(ctx context.Context, st idempotency.Stage, route string) (context.Context, func(idempotency.StageEnd)) {
	switch st {
	case idempotency.StageRequest:
		ctx = context.WithValue(ctx, marksKey{}, &requestMarks{})
	case idempotency.StageExecute:
		if m, ok := ctx.Value(marksKey{}).(*requestMarks); ok && route == "create_order" {
			m.executed.Store(true)
			s.executed.Add(1)
		}
	}
	return ctx, func(idempotency.StageEnd) {}
}

func (s *replaySources) Observe(ctx context.Context, e idempotency.Event) {
	if !e.Final || e.Outcome != idempotency.OutcomeReplayed || e.Route != "create_order" {
		return
	}
	m, _ := ctx.Value(marksKey{}).(*requestMarks)
	switch {
	case e.From == idempotency.ReplayFromCache:
		s.cache.Add(1)
	case m != nil && m.shared.Load() && !m.executed.Load():
		s.shared.Add(1)
	case m != nil && m.executed.Load():
		s.reexec.Add(1)
	default:
		s.store.Add(1)
	}
}

// probe adds the counters to a load probe: runLoad reports them per request.
func (s *replaySources) probe(base func() map[string]float64) func() map[string]float64 {
	return func() map[string]float64 {
		out := base()
		out["replay_from_cache"] = float64(s.cache.Load())
		out["replay_from_redis"] = float64(s.shared.Load())
		out["replay_from_store"] = float64(s.store.Load())
		out["replay_reexecuted"] = float64(s.reexec.Load())
		out["handler_runs"] = float64(s.executed.Load())
		return out
	}
}

// runFleet is the fleet family. Quick mode keeps it to the first mode at
// 20 % retries, without and with Redis, and Redis stopped mid-run.
func (r *runner) runFleet(ctx context.Context, f *family) error {
	c := headlineConc
	modes, shares := r.opts.modes, fleetRetryShares
	if r.opts.quick {
		modes, shares = modes[:1], []float64{fleetStopRetries}
	}
	fmt.Fprintf(os.Stderr, "== fleet: %d instances on one database, random routing, c=%d\n", fleetInstances, c)
	dbs := []*sql.DB{f.db}
	for len(dbs) < fleetInstances {
		dbs = append(dbs, f.openDB())
	}
	rd, err := openFleetRedis(ctx, r.opts.redis)
	if err != nil {
		r.note("fleet: the Redis variants were skipped: Redis at %s unreachable: %v", r.opts.redis, err)
		rd = nil
	} else {
		defer rd.close()
	}
	// serve starts one instance per database; with redisAddr, each has its
	// own idemredis.Cache (its own client) on it, as each process would.
	serve := func(opts orderservice.Options, redisAddr string) ([]string, []*idemredis.Cache, error) {
		var urls []string
		var caches []*idemredis.Cache
		for _, db := range dbs {
			o := opts
			if o.Idempotency {
				o.Store = idempotency.NewMySQLStore(db)
				if redisAddr != "" {
					rc, err := rd.cache(redisAddr)
					if err != nil {
						return nil, nil, err
					}
					caches = append(caches, rc)
					o.Config.SharedCache = sharedCounter{rc}
				}
			}
			svc, err := orderservice.New(db, o)
			if err != nil {
				return nil, nil, err
			}
			url, err := f.serveHTTP(svc)
			if err != nil {
				return nil, nil, err
			}
			urls = append(urls, url)
		}
		return urls, caches, nil
	}
	bareURLs, _, err := serve(orderservice.Options{}, "")
	if err != nil {
		return err
	}
	bare := target{url: bareURLs[0], gen: func(w *worker) request {
		rq := genBaseline(w)
		rq.url = bareURLs[rand.IntN(len(bareURLs))]
		return rq
	}, wantStatus: http.StatusCreated}
	baseProbe := f.probe
	if rd != nil {
		baseProbe = mariaAndRedisProbe(f.probe)
	}
	mixed := func(urls []string, share float64) target {
		mix := &fleetMix{urls: urls, retry: share, recent: make([]poolEntry, fleetRecent)}
		return target{url: urls[0], keyHeader: "Idempotency-Key", gen: mix.gen, done: mix.done, wantStatus: http.StatusCreated}
	}
	for _, mode := range modes {
		type fleet struct {
			name  string // "" or ", Redis"
			urls  []string
			probe func() map[string]float64
		}
		src := &replaySources{}
		urls, _, err := serve(orderservice.Options{Idempotency: true, Config: idempotency.Config{Mode: mode, Observer: src}}, "")
		if err != nil {
			return err
		}
		plain := fleet{"", urls, src.probe(baseProbe)}
		fleets := []fleet{plain}
		if rd != nil {
			src := &replaySources{}
			urls, caches, err := serve(orderservice.Options{Idempotency: true, Config: idempotency.Config{Mode: mode, Observer: src}}, rd.addr)
			if err != nil {
				return err
			}
			fleets = append(fleets, fleet{", Redis", urls, src.probe(redisCallsProbe(caches, baseProbe))})
		}
		for _, share := range shares {
			for _, fl := range fleets {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				variant := fmt.Sprintf("%s, %.0f%% retries%s", modeName(mode), 100*share, fl.name)
				r.measureFleet(f.client, fl.probe, c, bare, variant, mixed(fl.urls, share))
			}
		}
		// Retries right after the answer, on another instance
		// (fleet_immediate.go), at the larger share.
		for _, fl := range fleets {
			if r.opts.quick || ctx.Err() != nil {
				break
			}
			share := fleetRetryShares[len(fleetRetryShares)-1]
			variant := fmt.Sprintf("%s, %.0f%% retries at once, another instance%s", modeName(mode), 100*share, fl.name)
			r.measureFleet(f.client, fl.probe, c, bare, variant, immediateTarget(fl.urls, share, c))
		}
		if rd == nil || ctx.Err() != nil {
			continue
		}
		// Redis stopped mid-run: fresh instances whose caches reach Redis
		// through a proxy of ours, between runs of the bare create and of
		// the same mix without Redis.
		proxy, err := startProxy(rd.addr)
		if err != nil {
			return err
		}
		src = &replaySources{}
		urls, caches, err := serve(orderservice.Options{Idempotency: true, Config: idempotency.Config{Mode: mode, Observer: src}}, proxy.addr)
		if err != nil {
			proxy.stop()
			return err
		}
		variant := fmt.Sprintf("%s, %.0f%% retries, Redis stopped at half", modeName(mode), 100*fleetStopRetries)
		r.measureRedisStop(f.client, c, variant, bare, mixed(plain.urls, fleetStopRetries), plain.probe,
			mixed(urls, fleetStopRetries), src.probe(baseProbe), proxy, caches)
		proxy.stop()
	}
	return nil
}

// measureFleet is measureAgainst for a mixed point: it also keeps the bare
// create's mean latency, the denominator of the kinds' throughput ratios,
// and fills the point's Kinds.
func (r *runner) measureFleet(client *http.Client, probe func() map[string]float64, conc int, base target, variant string, t target) {
	n := max(r.opts.slices, 1)
	slice := r.opts.duration / time.Duration(n)
	var b0s, bs []*Point
	for i := range n {
		warmup := r.opts.warmup
		if i > 0 {
			warmup = min(warmup, 200*time.Millisecond)
		}
		b0s = append(b0s, r.sample(client, probe, famFleet, "B0", "", conc, 0, base, warmup, slice))
		bs = append(bs, r.sample(client, probe, famFleet, "F", variant, conc, 0, t, warmup, slice))
	}
	b0s = append(b0s, r.sample(client, probe, famFleet, "B0", "", conc, 0, base, 200*time.Millisecond, slice))
	p0, p := r.record(mergePoints(b0s)), r.record(mergePoints(bs))
	p.Baseline, p.BaselineRPS, p.BaselineP99 = "B0", p0.RPS, p0.P99
	p.Kinds = map[string]*KindStat{"bare": kindStat(p0.lat, conc, p0.Seconds)}
	for k, l := range p.kindLat {
		p.Kinds[k] = kindStat(l, conc, p.Seconds)
	}
	nw, rp := p.Kinds[kindNew], p.Kinds[kindReplay]
	if nw != nil && rp != nil {
		fmt.Fprintf(os.Stderr, "    new keys: thr %.2f, P99 %.2f × bare; replays: thr %.2f, P99 %.2f × bare; replays from cache/Redis/store/re-execution %s%s\n",
			nw.EquivRPS/p.Kinds["bare"].EquivRPS, nw.P99/p0.P99, rp.EquivRPS/p.Kinds["bare"].EquivRPS, rp.P99/p0.P99, sourceShares(p), redisCalls(p))
	}
}

func kindStat(sorted []time.Duration, conc int, seconds float64) *KindStat {
	k := &KindStat{Requests: len(sorted)}
	if len(sorted) == 0 {
		return k
	}
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	k.Mean = float64(sum) / float64(len(sorted)) / 1e6
	k.RPS = float64(len(sorted)) / seconds
	k.EquivRPS = float64(conc) / (k.Mean / 1e3)
	k.P50, k.P99 = percentile(sorted, 50), percentile(sorted, 99)
	return k
}

// redisCallsProbe adds the caches' failed and skipped calls and their
// downs to a probe (per request in the point, as every probe value).
func redisCallsProbe(caches []*idemredis.Cache, base func() map[string]float64) func() map[string]float64 {
	return func() map[string]float64 {
		out := base()
		s := redisStats(caches)
		out["redis_failed"] = float64(s.Errors)
		out["redis_skipped"] = float64(s.Skipped)
		out["redis_downs"] = float64(s.Downs)
		return out
	}
}

// redisCalls is the point's failed and skipped Redis calls and downs, for a
// point with Redis ("" for one without).
func redisCalls(p *Point) string {
	if _, ok := p.Server["redis_failed"]; !ok {
		return ""
	}
	n := float64(p.Requests)
	return fmt.Sprintf("; Redis calls failed %.0f, skipped %.0f, down %.0f times",
		p.Server["redis_failed"]*n, p.Server["redis_skipped"]*n, p.Server["redis_downs"]*n)
}

// sourceShares is where a point's replays came from, in % of its replays:
// this instance's cache / Redis / the store / a re-execution.
func sourceShares(p *Point) string {
	c, rd, s, x := p.Server["replay_from_cache"], p.Server["replay_from_redis"], p.Server["replay_from_store"], p.Server["replay_reexecuted"]
	all := c + rd + s + x
	if all == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f %%", 100*c/all, 100*rd/all, 100*s/all, 100*x/all)
}

// fleetMarkdown writes the fleet family's section, if it ran.
func (rep *Report) fleetMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famFleet && p.Bench == "F" })
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Fleet: three instances on one database\n\n")
	w("Three instances of examples/orderservice, each with its own *sql.DB (pool of 64), store and replay cache, over one MariaDB database, served in-process on loopback; every request goes to an instance picked at random. Workload: new keys, plus retries of keys answered moments before (picked from the latest %d), which land on any instance. Each mixed point alternates with the bare create on the same three instances (Idempotency=false) in %v slices. Concurrency %d. Rows marked *at once, another instance* retry each key as the worker's very next request after its answer, on one of the two instances that did not answer it (fleet_immediate.go). Rows marked Redis give each instance an `idemredis.Cache` of its own (its own client) on one Redis as Config.SharedCache, wired as `examples/server -redis` wires it (50 ms call timeout, 4 connections opened before the first request), under a key prefix new to the run, so entries of earlier runs never answer.\n\n", fleetRecent, rep.Options["slices"], headlineConc)
	w("| mode, retries | all req/s vs bare | new keys thr vs bare | new keys P99 vs bare | replays thr vs bare | replays P99 vs bare | replays from cache / Redis / store / re-execution | handler runs per replay | round trips/req |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		bare, nw, rp := p.Kinds["bare"], p.Kinds[kindNew], p.Kinds[kindReplay]
		if bare == nil || nw == nil || rp == nil || bare.EquivRPS == 0 {
			continue
		}
		// Handler runs beyond one per new key, per replay: the rolled-back
		// executions of replays.
		runs := p.Server["handler_runs"] * float64(p.Requests)
		runsPerReplay := max(0, runs-float64(nw.Requests)) / max(1, float64(rp.Requests))
		w("| %s | %.2f | %.2f | %.2f | **%.2f** | **%.2f** | %s | %.2f | %.1f |\n", p.Variant, p.RPS/p.BaselineRPS,
			nw.EquivRPS/bare.EquivRPS, nw.P99/p.BaselineP99, rp.EquivRPS/bare.EquivRPS, rp.P99/p.BaselineP99,
			sourceShares(p), runsPerReplay, p.Server["round_trips"])
	}
	w("\nA kind's throughput ratio is (concurrency / its mean latency in the mix) over (concurrency / the bare create's mean latency): by Little's law, what a closed loop sending only that kind would answer at the latencies it had in the mix, over the bare create's. P99 ratios are over the bare create's P99 in the alternating slices. Sources come from a counting Observer: `Event.From` (cache or store), a wrapper of the shared cache that marks a request whose GetReplay found an entry (Redis), and, for a re-execution, a StageExecute in the same request. Handler runs per replay counts executions beyond one per new key (rolled-back runs of replays).\n\n")
	rep.fleetTargets(b, pts)
	rep.table(b, famFleet, pts, true)
	rep.redisStopMarkdown(b)
}

// fleetTargets writes whether the 20 % points meet issue 13's targets: with
// Redis, replays at ≥ 5 × the bare create's throughput and ≤ 0.3 × its P99;
// without Redis, single-phase replays at ≤ 0.5 × its P99.
func (rep *Report) fleetTargets(b *strings.Builder, pts []*Point) {
	var lines []string
	for _, p := range pts {
		bare, rp := p.Kinds["bare"], p.Kinds[kindReplay]
		if bare == nil || rp == nil || bare.EquivRPS == 0 || p.BaselineP99 == 0 || !strings.Contains(p.Variant, "20% retries") {
			continue
		}
		thr, p99 := rp.EquivRPS/bare.EquivRPS, rp.P99/p.BaselineP99
		met := map[bool]string{true: "met", false: "**not met**"}
		switch {
		case strings.HasSuffix(p.Variant, ", Redis"):
			lines = append(lines, fmt.Sprintf("%s: replays %.2f × the bare create's throughput (target ≥ 5) and %.2f × its P99 (target ≤ 0.3): %s",
				p.Variant, thr, p99, met[thr >= 5 && p99 <= 0.3]))
		case strings.HasPrefix(p.Variant, "single-phase"):
			lines = append(lines, fmt.Sprintf("%s: replays %.2f × the bare create's P99 (target ≤ 0.5): %s", p.Variant, p99, met[p99 <= 0.5]))
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "Issue 13's targets at 20 %% retries:\n\n")
	for _, l := range lines {
		fmt.Fprintf(b, "- %s.\n", l)
	}
	fmt.Fprintf(b, "\n")
}
