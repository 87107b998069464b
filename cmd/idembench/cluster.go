package main

// The cluster family (issue 11): the example order service on a Galera
// cluster. Two instances, each over its own node, against one instance on
// one node, each as a ratio to its own bare baseline (Idempotency=false)
// measured in alternating slices; the cost of the wsrep_sync_wait=1 prefix
// that adaptMySQL puts on Lookup, as a replay-through-the-database ratio
// and as a raw Lookup latency ratio.
//
// It runs only when -galera-dsns names the nodes: CI's quick run has no
// cluster. scripts/galera.sh starts one (GALERA_PORT moves it off the
// ports another cluster uses).

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// Families of the cluster points. Each has its own B0, so aggregateB0 and
// computeRatios treat them as they treat mariadb and sqlite.
const (
	famGalera1 = "galera-1i1n" // one instance on node 1
	famGalera2 = "galera-2i2n" // two instances, on nodes 1 and 2
	famGaleraW = "galera-syncwait"
)

// ClusterResult is what the cluster family measures besides load points.
type ClusterResult struct {
	Nodes       int               `json:"nodes"`
	Concurrency int               `json:"concurrency"`
	Server      string            `json:"server_version"`
	Settings    map[string]string `json:"node_settings"`
	WsrepOn     string            `json:"wsrep_on"`
	Lookups     []LookupLatency   `json:"lookup_latency"`
	StaleReads  int               `json:"stale_reads_without_sync_wait"`
	FreshReads  int               `json:"fresh_reads_tried"`
}

// LookupLatency is the raw Lookup micro-measure of one store.
type LookupLatency struct {
	Store string  `json:"store"`
	N     int     `json:"n"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
}

type galeraNode struct {
	n      int
	admin  *sql.DB
	db     *sql.DB
	synced idempotency.Store // NewMySQLStore: Lookup with wsrep_sync_wait=1
	plain  idempotency.Store // MySQLDialect without Adapt: no sync wait
	pid    int
}

// request.url routing: generators that send each request to one instance.

// routed sends worker w's requests to urls[w.id%len(urls)], as a balancer
// with keep-alive connections spreads clients over the instances.
func routed(gen generator, urls []string) generator {
	return func(w *worker) request {
		rq := gen(w)
		rq.url = urls[w.id%len(urls)]
		return rq
	}
}

// genReplayTo replays pool round-robin, entry i to urls[i].
func genReplayTo(pool []poolEntry, urls []string) generator {
	var next atomic.Uint64
	return func(w *worker) request {
		i := (next.Add(1) - 1) % uint64(len(pool))
		e := &pool[i]
		return request{key: e.key, user: e.user, body: e.body, want: e.resp, url: urls[i]}
	}
}

func splitDSNs(s string) []string {
	var out []string
	for _, d := range strings.Split(s, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// runCluster is the cluster family.
func (r *runner) runCluster(ctx context.Context) error {
	dsns := splitDSNs(r.opts.galeraDSNs)
	if len(dsns) < 2 {
		return errors.New("-galera-dsns: name at least two nodes (of a three-node cluster)")
	}
	f := &family{name: "galera", client: newClient(64)}
	defer f.close()
	res := &ClusterResult{Nodes: len(dsns), Concurrency: r.opts.clusterConc, Settings: map[string]string{}}
	r.cluster = res

	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "idembench_" + hex.EncodeToString(b[:]) + "_galera"
	counts := &sqlCounts{}
	var nodes []*galeraNode
	var extraPids []int // nodes beyond the two the instances use
	for i, dsn := range dsns {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return fmt.Errorf("-galera-dsns: %w", err)
		}
		acfg := cfg.Clone()
		acfg.DBName = ""
		admin, err := sql.Open("mysql", acfg.FormatDSN())
		if err != nil {
			return err
		}
		admin.SetMaxOpenConns(2)
		f.cleanup = append(f.cleanup, func() { admin.Close() })
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var state, ready, size string
		err = admin.QueryRowContext(pctx, `SELECT
  MAX(IF(VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT', VARIABLE_VALUE, NULL)),
  MAX(IF(VARIABLE_NAME = 'WSREP_READY', VARIABLE_VALUE, NULL)),
  MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_SIZE', VARIABLE_VALUE, NULL))
FROM information_schema.GLOBAL_STATUS`).Scan(&state, &ready, &size)
		cancel()
		if err != nil {
			return fmt.Errorf("Galera node %d at %s: %w", i+1, cfg.Addr, err)
		}
		if state != "Synced" || ready != "ON" {
			return fmt.Errorf("Galera node %d at %s is not ready (state %s, ready %s)", i+1, cfg.Addr, state, ready)
		}
		res.Settings["wsrep_cluster_size"] = size
		node := &galeraNode{n: i + 1, admin: admin}
		var pidFile string
		if admin.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile) == nil {
			if bs, err := os.ReadFile(pidFile); err == nil {
				node.pid, _ = strconv.Atoi(strings.TrimSpace(string(bs)))
			}
		}
		if i >= 2 {
			extraPids = append(extraPids, node.pid)
			continue
		}
		if i == 0 {
			_ = admin.QueryRowContext(ctx, "SELECT VERSION(), @@wsrep_on").Scan(&res.Server, &res.WsrepOn)
			for _, v := range []string{"innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "wsrep_provider_options"} {
				var val string
				if admin.QueryRowContext(ctx, "SELECT @@"+v).Scan(&val) == nil {
					if v == "wsrep_provider_options" {
						val = pickOptions(val, "evs.suspect_timeout", "gcs.fc_limit", "evs.send_window")
					}
					res.Settings[v] = val
				}
			}
			if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4"); err != nil {
				return fmt.Errorf("create database %s: %w", name, err)
			}
			f.cleanup = append(f.cleanup, func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
					fmt.Fprintf(os.Stderr, "idembench: drop database %s: %v\n", name, err)
				}
			})
		}
		app := cfg.Clone()
		app.DBName = name
		app.InterpolateParams = true
		app.ParseTime = true
		app.AllowAllFiles = false
		connector, err := mysql.NewConnector(app)
		if err != nil {
			return err
		}
		db := sql.OpenDB(countingConnector{Connector: connector, n: counts})
		db.SetMaxOpenConns(64)
		db.SetMaxIdleConns(64)
		db.SetConnMaxLifetime(time.Hour)
		f.cleanup = append(f.cleanup, func() { db.Close() })
		node.db = db
		node.synced = idempotency.NewMySQLStore(db)
		d := idempotency.MySQLDialect
		d.Adapt = nil
		node.plain = idempotency.NewSQLStore(db, d)
		nodes = append(nodes, node)
	}
	n1, n2 := nodes[0], nodes[1]
	if err := orderservice.Setup(ctx, n1.db, "mysql"); err != nil {
		return fmt.Errorf("setup on node 1: %w", err)
	}
	// The schema and seed replicate; wait until node 2 has them.
	var skus int
	if err := n2.db.QueryRowContext(ctx, "SET STATEMENT wsrep_sync_wait=1 FOR SELECT COUNT(*) FROM sku").Scan(&skus); err != nil || skus != orderservice.LastSKU-orderservice.FirstSKU+1 {
		return fmt.Errorf("node 2 lacks the seeded catalog (%d SKUs, %v)", skus, err)
	}
	probe := clusterProbe(counts, nodes, extraPids)

	serve := func(n *galeraNode, opts orderservice.Options) string {
		svc, err := orderservice.New(n.db, opts)
		if err == nil {
			var url string
			if url, err = f.serveHTTP(svc); err == nil {
				return url
			}
		}
		panic(err) // only on a listen failure: the run is broken
	}
	protect := func(n *galeraNode, store idempotency.Store, cfg idempotency.Config) string {
		return serve(n, orderservice.Options{Idempotency: true, Store: store, Config: cfg})
	}
	bare1 := []string{serve(n1, orderservice.Options{})}
	bare2 := []string{serve(n1, orderservice.Options{}), serve(n2, orderservice.Options{})}
	cfgOn := idempotency.Config{Mode: idempotency.ModeClaimFirst}
	cfgOff := idempotency.Config{Mode: idempotency.ModeClaimFirst, ReplayCacheBytes: -1}
	first1 := []string{protect(n1, n1.synced, cfgOn)}
	first2 := []string{protect(n1, n1.synced, cfgOn), protect(n2, n2.synced, cfgOn)}

	newKeyT := func(urls []string) target {
		return target{url: urls[0], keyHeader: "Idempotency-Key", gen: routed(genNewKey, urls), wantStatus: http.StatusCreated}
	}
	bareT := func(urls []string) target {
		// Unprotected creates on two nodes can fail certification at
		// commit (503 commit-outcome-unknown): counted apart, not as
		// errors; throughput counts the 201s.
		return target{url: urls[0], gen: routed(genBaseline, urls), wantStatus: http.StatusCreated, tolerateStatus: http.StatusServiceUnavailable}
	}
	// Replay pool: half created through the instance on node 1, half on
	// node 2. The two-instance replays go to the other instance's node.
	half := max(r.opts.poolSize/2, 16)
	poolA, err := createPool(f.client, newKeyT(first2[:1]), half, 16)
	if err != nil {
		return err
	}
	poolB, err := createPool(f.client, newKeyT(first2[1:]), half, 16)
	if err != nil {
		return err
	}
	pool := append(slices.Clone(poolA), poolB...)
	replayT := func(urlsA, urlsB string) target {
		urls := make([]string, len(pool))
		for i := range pool {
			urls[i] = urlsA
			if i >= len(poolA) {
				urls[i] = urlsB
			}
		}
		return target{url: urlsA, keyHeader: "Idempotency-Key", gen: genReplayTo(pool, urls), wantStatus: http.StatusCreated, wantReplayed: true}
	}
	// Keys created on node 1 replay on node 2 and vice versa.
	cross := func(on1, on2 string) target { return replayT(on2, on1) }

	c := r.opts.clusterConc
	fmt.Fprintf(os.Stderr, "== galera: 1 instance/1 node vs 2 instances/2 nodes, c=%d, each against its own B0\n", c)
	r.measureAgainst(f.client, probe, famGalera1, c, 0, "B0", bareT(bare1), "B1", "claim-first", newKeyT(first1))
	r.measureAgainst(f.client, probe, famGalera2, c, 0, "B0", bareT(bare2), "B1", "claim-first", newKeyT(first2))
	for _, cache := range []bool{true, false} {
		cfg, variant := cfgOn, "claim-first, cache on"
		if !cache {
			cfg, variant = cfgOff, "claim-first, cache off"
		}
		one := protect(n1, n1.synced, cfg)
		r.measureAgainst(f.client, probe, famGalera1, c, 0, "B0", bareT(bare1), "B2", variant, replayT(one, one))
		on1, on2 := protect(n1, n1.synced, cfg), protect(n2, n2.synced, cfg)
		r.measureAgainst(f.client, probe, famGalera2, c, 0, "B0", bareT(bare2), "B2", variant+", other node", cross(on1, on2))
	}

	fmt.Fprintf(os.Stderr, "== galera: wsrep_sync_wait=1 on Lookup, replay cache off, replays on the other node\n")
	syncT := cross(protect(n1, n1.synced, cfgOff), protect(n2, n2.synced, cfgOff))
	plainT := cross(protect(n1, n1.plain, cfgOff), protect(n2, n2.plain, cfgOff))
	r.measureAgainst(f.client, probe, famGaleraW, c, 0, "SW0", plainT, "SW", "Lookup with wsrep_sync_wait=1", syncT)

	return r.lookupMicro(ctx, res, n1, n2, poolA)
}

// lookupMicro is the raw measure: sequential Lookups on node 2 of a key
// written on node 1, with and without the sync-wait prefix, alternating in
// blocks so drift hits both. Then a freshness probe: a key claimed on node 1
// and looked up on node 2 at once, without the prefix, is it there?
func (r *runner) lookupMicro(ctx context.Context, res *ClusterResult, n1, n2 *galeraNode, poolA []poolEntry) error {
	e := poolA[0]
	scope := strconv.Itoa(e.user)
	stores := []struct {
		name string
		s    idempotency.Store
	}{{"NewMySQLStore (SET STATEMENT wsrep_sync_wait=1 FOR …)", n2.synced}, {"MySQLDialect, Adapt=nil (no sync wait)", n2.plain}}
	for _, st := range stores { // adapt and warm the pool
		for range 20 {
			rec, err := st.s.Lookup(ctx, scope, e.key)
			if err != nil {
				return fmt.Errorf("lookup micro: %s: %w", st.name, err)
			}
			if rec == nil {
				return fmt.Errorf("lookup micro: %s: node 2 does not have node 1's key %s", st.name, e.key)
			}
		}
	}
	const block = 100
	n := r.opts.lookupN
	lats := make([][]time.Duration, len(stores))
	for done := 0; done < n; done += block {
		for i, st := range stores {
			for range min(block, n-done) {
				t0 := time.Now()
				if _, err := st.s.Lookup(ctx, scope, e.key); err != nil {
					return fmt.Errorf("lookup micro: %s: %w", st.name, err)
				}
				lats[i] = append(lats[i], time.Since(t0))
			}
		}
	}
	for i, st := range stores {
		l := lats[i]
		slices.Sort(l)
		var sum time.Duration
		for _, d := range l {
			sum += d
		}
		ll := LookupLatency{Store: st.name, N: len(l), P50: percentile(l, 50), P99: percentile(l, 99), Mean: float64(sum) / float64(len(l)) / 1e6}
		res.Lookups = append(res.Lookups, ll)
		fmt.Fprintf(os.Stderr, "  galera   Lookup on node 2, %-52s n=%d  p50 %6.3f ms  p99 %6.3f ms\n", st.name, ll.N, ll.P50, ll.P99)
	}

	// Freshness: what the prefix buys. Claim a fresh key on node 1 and look
	// it up on node 2 immediately without the prefix.
	for i := range 200 {
		key := fmt.Sprintf("idembench-fresh-%d-%d", time.Now().UnixNano(), i)
		if _, err := n1.synced.Claim(ctx, idempotency.Claim{Scope: scope, Key: key, Fingerprint: "fp", Owner: "idembench", Lease: time.Minute, Retention: time.Hour}); err != nil {
			r.note("galera freshness probe: claim on node 1: %v", err)
			break
		}
		rec, err := n2.plain.Lookup(ctx, scope, key)
		if err != nil && !errors.Is(err, idempotency.ErrRecordNotFound) {
			r.note("galera freshness probe: lookup on node 2: %v", err)
			break
		}
		res.FreshReads++
		if rec == nil {
			res.StaleReads++
		}
	}
	fmt.Fprintf(os.Stderr, "  galera   freshness: %d of %d lookups on node 2 without sync wait missed a key just claimed on node 1\n", res.StaleReads, res.FreshReads)
	return nil
}

// pickOptions keeps the named entries of a wsrep_provider_options string.
func pickOptions(all string, names ...string) string {
	var out []string
	for _, kv := range strings.Split(all, ";") {
		kv = strings.TrimSpace(kv)
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(names, strings.TrimSpace(k)) {
			out = append(out, kv)
		}
	}
	return strings.Join(out, "; ")
}

// clusterProbe is mariaProbe for the cluster: this process's round trips
// (both nodes), and CPU of this process and of every node's mariadbd (node 3
// serves no instance but applies every write set).
func clusterProbe(counts *sqlCounts, nodes []*galeraNode, extraPids []int) func() map[string]float64 {
	return func() map[string]float64 {
		out := map[string]float64{"cpu_self": procCPU("self"), "cpu_total": machineBusyCPU()}
		for k, v := range counts.snapshot() {
			out[k] = v
		}
		var db float64
		for _, n := range nodes {
			if n.pid > 0 {
				db += procCPU(strconv.Itoa(n.pid))
			}
		}
		for _, pid := range extraPids {
			if pid > 0 {
				db += procCPU(strconv.Itoa(pid))
			}
		}
		out["cpu_db"] = db
		var cert float64
		for _, n := range nodes {
			var name string
			var v float64
			if n.admin.QueryRow("SHOW GLOBAL STATUS LIKE 'wsrep_local_cert_failures'").Scan(&name, &v) == nil {
				cert += v
			}
		}
		out["cert_failures"] = cert
		return out
	}
}

// clusterMarkdown writes the cluster family's section, if it ran.
func (rep *Report) clusterMarkdown(b *strings.Builder) {
	cl := rep.Cluster
	pts := rep.pointsOf(func(p *Point) bool { return strings.HasPrefix(p.Family, "galera-") })
	if cl == nil || len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	find := func(fam, bench, variantPrefix string) *Point {
		for _, p := range pts {
			if p.Family == fam && p.Bench == bench && strings.HasPrefix(p.Variant, variantPrefix) {
				return p
			}
		}
		return nil
	}
	b0 := func(fam string) *Point {
		for _, g := range rep.B0 {
			if g.Family == fam {
				return g
			}
		}
		return nil
	}
	w("## Cluster (Galera, three nodes on loopback)\n\n")
	w("%s, wsrep_on=%s, cluster size %s; %s. Concurrency %d, claim-first. ", cl.Server, cl.WsrepOn, cl.Settings["wsrep_cluster_size"],
		settingsLine(cl.Settings), cl.Concurrency)
	w("**1i/1n**: one instance of examples/orderservice over node 1. **2i/2n**: two instances, one over node 1 and one over node 2 (its own *sql.DB), each served in-process on loopback; worker w sends to instance w%%2. Each side is a ratio to its own bare baseline (Idempotency=false, the same instances' unprotected handlers), alternating with it in %v slices. Replays in 2i/2n land on the other instance's node (keys created through node 1 are replayed through node 2 and vice versa); in 1i/1n on the one instance.\n\n", rep.Options["slices"])
	w("| scenario | 1i/1n req/s | 1i/1n vs B0 thr | 1i/1n P99 ms | 1i/1n vs B0 P99 | 2i/2n req/s | 2i/2n vs B0 thr | 2i/2n P99 ms | 2i/2n vs B0 P99 | (2i/2n)/(1i/1n) thr ratio | 503 share 1i/2i | cert failures/req 1i/2i | cpu%% other 1i/2i |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	share := func(p *Point) string {
		var all int
		for _, n := range p.Statuses {
			all += n
		}
		if all == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(p.Statuses["503"])/float64(all))
	}
	rel := func(p *Point) (float64, float64) {
		if p == nil || p.BaselineRPS == 0 {
			return 0, 0
		}
		return p.RPS / p.BaselineRPS, p.P99 / p.BaselineP99
	}
	if a, c := b0(famGalera1), b0(famGalera2); a != nil && c != nil {
		w("| B0 bare (%s / %s) | %.0f | 1 | %.2f | 1 | %.0f | 1 | %.2f | 1 | | %s / %s | %.3f / %.3f | %.0f / %.0f |\n", a.Variant, c.Variant, a.RPS, a.P99, c.RPS, c.P99,
			share(a), share(c), a.Server["cert_failures"], c.Server["cert_failures"], a.Server["cpu_other"], c.Server["cpu_other"])
	}
	for _, row := range []struct{ name, bench, variant string }{
		{"B1 new key", "B1", "claim-first"},
		{"B2 replay, cache on", "B2", "claim-first, cache on"},
		{"B2 replay, cache off", "B2", "claim-first, cache off"},
	} {
		a, c := find(famGalera1, row.bench, row.variant), find(famGalera2, row.bench, row.variant)
		if a == nil || c == nil {
			continue
		}
		at, ap := rel(a)
		ct, cp := rel(c)
		w("| %s | %.0f | **%.2f** | %.2f | %.2f | %.0f | **%.2f** | %.2f | %.2f | %.2f | %s / %s | %.3f / %.3f | %.0f / %.0f |\n", row.name,
			a.RPS, at, a.P99, ap, c.RPS, ct, c.P99, cp, ct/at, share(a), share(c), a.Server["cert_failures"], c.Server["cert_failures"], a.Server["cpu_other"], c.Server["cpu_other"])
	}
	w("\nreq/s counts 201 answers only. A bare create on two nodes can fail Galera certification at commit (the service answers 503 commit-outcome-unknown; `503 share` is their share of all answers, `cert failures/req` is wsrep_local_cert_failures summed over the nodes, per completed request); those are left out of the baseline's throughput rather than failing the run, so a 2i/2n baseline with conflicts is a baseline of successful creates. On the middleware's paths a 503 is not tolerated: it counts as an error (the err column of the tables below).\n\n")
	if p := find(famGaleraW, "SW", ""); p != nil && p.BaselineRPS > 0 {
		w("**Cost of `wsrep_sync_wait=1` on Lookup** (2i/2n, replay cache off, every replay on the other instance's node, so each is a duplicate-key Claim plus a Lookup): NewMySQLStore (adapted: `SET STATEMENT wsrep_sync_wait=1 FOR` the lookup) %.0f req/s, P99 %.2f ms, against a store from MySQLDialect with Adapt=nil (no sync wait) %.0f req/s, P99 %.2f ms, alternating in slices: throughput ratio **%.2f**, P99 ratio **%.2f**.\n\n",
			p.RPS, p.P99, p.BaselineRPS, p.BaselineP99, p.RPS/p.BaselineRPS, p.P99/p.BaselineP99)
	}
	if len(cl.Lookups) == 2 {
		s, n := cl.Lookups[0], cl.Lookups[1]
		w("Raw Lookup latency: %d sequential Lookups per store on node 2 of one key written through node 1, alternating in blocks of 100:\n\n", s.N)
		w("| store | n | P50 ms | P99 ms | mean ms |\n|---|---:|---:|---:|---:|\n")
		for _, l := range cl.Lookups {
			w("| %s | %d | %.3f | %.3f | %.3f |\n", l.Store, l.N, l.P50, l.P99, l.Mean)
		}
		w("| **ratio sync/no-sync** | | **%.2f** | **%.2f** | %.2f |\n\n", s.P50/n.P50, s.P99/n.P99, s.Mean/n.Mean)
	}
	if cl.FreshReads > 0 {
		w("What the wait buys: of %d keys claimed through node 1 and looked up through node 2 immediately after, without the sync wait, %d were not found yet.\n\n", cl.FreshReads, cl.StaleReads)
	}
	w("Caveat: all three nodes, both instances and the load generator share this machine's %s cores, so a second node adds no capacity here — it adds replication work (every write set is certified and applied on all three nodes). The numbers are overhead ratios against the same topology's bare handlers, not a scaling result.\n\n", rep.Machine.Nproc)
	rep.table(b, famGalera1, rep.pointsOf(func(p *Point) bool { return p.Family == famGalera1 && p.Bench != "B0" }), true)
	rep.table(b, famGalera2, rep.pointsOf(func(p *Point) bool { return p.Family == famGalera2 && p.Bench != "B0" }), true)
}

func settingsLine(m map[string]string) string {
	var out []string
	for k, v := range m {
		if k != "wsrep_cluster_size" && v != "" {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
