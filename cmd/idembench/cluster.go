package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

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

	name := databaseName("galera")
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
			if err := f.createDatabase(ctx, admin, name, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4", "DROP DATABASE IF EXISTS "+name); err != nil {
				return err
			}
		}
		db, err := f.mariaPool(cfg, name, counts)
		if err != nil {
			return err
		}
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
	// replayT replays the keys of poolA to urlA, the others to urlB.
	replayT := func(urlA, urlB string) target {
		p := slices.Clone(pool)
		for i := range p {
			p[i].url = urlA
			if i >= len(poolA) {
				p[i].url = urlB
			}
		}
		return target{url: urlA, keyHeader: "Idempotency-Key", gen: genReplay(p), wantStatus: http.StatusCreated, wantReplayed: true}
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
		maps.Copy(out, counts.snapshot())
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
