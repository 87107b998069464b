package main

// The cluster family's raw Lookup measure and its section of the report.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

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
		ll := LookupLatency{Store: st.name, N: len(l), P50: percentile(l, 50), P99: percentile(l, 99), Mean: meanMS(l)}
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
	settings := maps.Clone(cl.Settings)
	maps.DeleteFunc(settings, func(k, v string) bool { return k == "wsrep_cluster_size" || v == "" })
	w("## Cluster (Galera, three nodes on loopback)\n\n")
	w("%s, wsrep_on=%s, cluster size %s; %s. Concurrency %d, claim-first. ", cl.Server, cl.WsrepOn, cl.Settings["wsrep_cluster_size"],
		settingsLine(settings), cl.Concurrency)
	w("**1i/1n**: one instance of examples/orderservice over node 1. **2i/2n**: two instances, one over node 1 and one over node 2 (its own *sql.DB), each served in-process on loopback; worker w sends to instance w%%2. Each side is a ratio to its own bare baseline (Idempotency=false, the same instances' unprotected handlers), alternating with it in %v slices. Replays in 2i/2n land on the other instance's node (keys created through node 1 are replayed through node 2 and vice versa); in 1i/1n on the one instance.\n\n", rep.optionsOf("galera")["slices"])
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
	if a, c := rep.headlineB0(famGalera1), rep.headlineB0(famGalera2); a != nil && c != nil {
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
