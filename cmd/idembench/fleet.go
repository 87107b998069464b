package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemredis "github.com/orderguard/idempotency/redis"
)

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

const (
	famFleet       = "fleet-3i"
	fleetInstances = 3
	// fleetRecent is how many of the latest answered new keys a retry picks
	// from: an agent retries what it sent moments ago.
	fleetRecent = 1024
)

// fleetRetryShares are the mixed points' shares of retries.
var fleetRetryShares = []float64{0.05, 0.20}

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
			rq := e.replay()
			rq.url, rq.kind = url, kindReplay
			return rq
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
	e := answered(w, rq)
	m.mu.Lock()
	m.recent[m.n%len(m.recent)] = e
	m.n++
	m.mu.Unlock()
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
		db, err := f.openDB()
		if err != nil {
			return err
		}
		dbs = append(dbs, db)
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
		// protected starts the instances of mode, counting where their
		// replays come from in src.
		protected := func(redisAddr string) ([]string, []*idemredis.Cache, *replaySources, error) {
			src := &replaySources{}
			urls, caches, err := serve(orderservice.Options{Idempotency: true, Config: idempotency.Config{Mode: mode, Observer: src}}, redisAddr)
			return urls, caches, src, err
		}
		urls, _, src, err := protected("")
		if err != nil {
			return err
		}
		plain := fleet{"", urls, src.probe(baseProbe)}
		fleets := []fleet{plain}
		if rd != nil {
			urls, caches, src, err := protected(rd.addr)
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
			r.measureFleet(f.client, fl.probe, c, bare, variant, immediateTarget(fl.urls, share, c, false))
		}
		// The same retries on the instance that answered: replays from
		// its own cache, no call out of the process, the floor of any
		// replay's P99 in this mix (issue 37).
		if !r.opts.quick && ctx.Err() == nil {
			share := fleetRetryShares[len(fleetRetryShares)-1]
			variant := fmt.Sprintf("%s, %.0f%% retries at once, same instance", modeName(mode), 100*share)
			r.measureFleet(f.client, plain.probe, c, bare, variant, immediateTarget(plain.urls, share, c, true))
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
		urls, caches, src, err := protected(proxy.addr)
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
	p0, p := r.measureAgainst(client, probe, famFleet, conc, 0, "B0", base, "F", variant, t)
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

// fleetMarkdown writes the fleet family's section, if it ran.
func (rep *Report) fleetMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famFleet && p.Bench == "F" })
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Fleet: three instances on one database\n\n")
	w("Three instances of examples/orderservice, each with its own *sql.DB (pool of 64), store and replay cache, over one MariaDB database, served in-process on loopback; every request goes to an instance picked at random. Workload: new keys, plus retries of keys answered moments before (picked from the latest %d), which land on any instance. Each mixed point alternates with the bare create on the same three instances (Idempotency=false) in %v slices. Concurrency %d. Rows marked *at once, another instance* retry each key as the worker's very next request after its answer, on one of the two instances that did not answer it (fleet_immediate.go); *at once, same instance* on the one that did, whose own cache answers it with no call out of the process: in the same mix, the floor of any replay's P99. Rows marked Redis give each instance an `idemredis.Cache` of its own (its own client) on one Redis as Config.SharedCache, wired as `examples/server -redis` wires it (50 ms call timeout, 4 connections opened before the first request), under a key prefix new to the run, so entries of earlier runs never answer.\n\n", fleetRecent, rep.optionsOf("fleet")["slices"], headlineConc)
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
	w("\nA kind's throughput ratio is (concurrency / its mean latency in the mix) over (concurrency / the bare create's mean latency): by Little's law, what a closed loop sending only that kind would answer at the latencies it had in the mix, over the bare create's. P99 ratios are over the bare create's P99 in the alternating slices. Sources come from a counting Observer: `Event.From` (cache or store), a wrapper of the shared cache that marks a request whose MarkUnlessReplay found an entry (Redis), and, for a re-execution, a StageExecute in the same request. Handler runs per replay counts executions beyond one per new key (rolled-back runs of replays).\n\n")
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
