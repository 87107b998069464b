package clustertest_test

// The cluster every test shares: one fresh database per test on the Galera
// cluster, one connection pool per node as the service opens it, one per node
// for reads that must see every write committed anywhere, and the order
// service instances that serve HTTP over the nodes.
//
// The tests do not call t.Parallel: each reports the nodes' certification
// counters, which are global to a node, and the node-kill test takes node 2
// away from everything running beside it.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

const (
	envDSNs    = "IDEMPOTENCY_GALERA_DSNS"
	envRequire = "IDEMPOTENCY_REQUIRE_GALERA"
)

// cluster is one test's database on the Galera cluster. Nodes are numbered
// from 1, in the order of IDEMPOTENCY_GALERA_DSNS.
type cluster struct {
	name  string
	addrs []string        // host:port per node
	app   map[int]*sql.DB // per node, opened as the service opens it
	check map[int]*sql.DB // per node, wsrep_sync_wait=1 (causal reads)
}

// unavailable skips the test, or fails it when the cluster is required.
func unavailable(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv(envRequire) == "1" {
		t.Fatal(msg + " (" + envRequire + "=1: the cluster is required)")
	}
	t.Skip(msg + " (set " + envRequire + "=1 to make this a failure)")
}

// nodeConfigs parses IDEMPOTENCY_GALERA_DSNS.
func nodeConfigs(t *testing.T) []*mysql.Config {
	t.Helper()
	testdb.CaptureDriverLog(t) // node kills cut connections: their log lines go to a failing test's log
	raw := strings.TrimSpace(os.Getenv(envDSNs))
	if raw == "" {
		unavailable(t, envDSNs+" is not set: no Galera cluster to test against; scripts/galera.sh start runs one and prints the DSNs")
	}
	var cfgs []*mysql.Config
	for _, dsn := range strings.Split(raw, ",") {
		cfg, err := mysql.ParseDSN(strings.TrimSpace(dsn))
		require.NoError(t, err, "%s: %q", envDSNs, dsn)
		cfgs = append(cfgs, cfg)
	}
	if len(cfgs) < 2 {
		t.Fatalf("%s lists %d node; the cluster tests need at least 2", envDSNs, len(cfgs))
	}
	return cfgs
}

// newCluster checks that every node answers and belongs to one synced
// Galera cluster, creates the test's database (CREATE DATABASE replicates),
// applies the order service's schema and seed on node 1, waits until every
// node has them, and drops the database when the test ends.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	base := nodeConfigs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c := &cluster{app: map[int]*sql.DB{}, check: map[int]*sql.DB{}}
	admin := map[int]*sql.DB{}
	var clusterUUID string
	for i, cfg := range base {
		n := i + 1
		c.addrs = append(c.addrs, cfg.Addr)
		a := causal(cfg)
		a.DBName = ""
		db, err := sql.Open("mysql", a.FormatDSN())
		require.NoError(t, err)
		db.SetMaxOpenConns(2)
		t.Cleanup(func() { db.Close() })
		admin[n] = db
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = db.PingContext(pingCtx)
		cancel()
		if err != nil {
			unavailable(t, fmt.Sprintf("Galera node %d at %s is unreachable: %v", n, cfg.Addr, err))
		}
		st := wsrepStatus(t, db, "wsrep_ready", "wsrep_local_state_comment", "wsrep_cluster_state_uuid", "wsrep_cluster_size")
		if st["wsrep_ready"] == "" {
			t.Fatalf("node %d at %s is not a Galera node (no wsrep status): check %s", n, cfg.Addr, envDSNs)
		}
		if st["wsrep_ready"] != "ON" || st["wsrep_local_state_comment"] != "Synced" {
			unavailable(t, fmt.Sprintf("Galera node %d at %s is not ready: wsrep_ready=%s, state %s",
				n, cfg.Addr, st["wsrep_ready"], st["wsrep_local_state_comment"]))
		}
		if clusterUUID == "" {
			clusterUUID = st["wsrep_cluster_state_uuid"]
		} else if st["wsrep_cluster_state_uuid"] != clusterUUID {
			t.Fatalf("node %d at %s belongs to another cluster (%s, node 1: %s)", n, cfg.Addr, st["wsrep_cluster_state_uuid"], clusterUUID)
		}
	}

	var b [6]byte
	_, _ = rand.Read(b[:])
	c.name = "idem_galera_" + hex.EncodeToString(b[:])
	_, err := admin[1].ExecContext(ctx, "CREATE DATABASE "+c.name+" CHARACTER SET utf8mb4")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		for n := 1; n <= len(admin); n++ { // node 1 first; another if it is down
			if _, err = admin[n].ExecContext(ctx, "DROP DATABASE IF EXISTS "+c.name); err == nil {
				return
			}
		}
		t.Errorf("drop database %s: %v", c.name, err)
	})
	for n, db := range admin {
		var got string
		require.NoError(t, db.QueryRowContext(ctx,
			"SELECT schema_name FROM information_schema.schemata WHERE schema_name = ?", c.name).Scan(&got),
			"node %d does not have database %s", n, c.name)
	}

	for i, cfg := range base {
		n := i + 1
		app := cfg.Clone()
		app.DBName = c.name
		db, err := orderservice.OpenMySQL(ctx, app)
		require.NoError(t, err, "node %d", n)
		t.Cleanup(func() { db.Close() })
		c.app[n] = db

		chk := causal(app)
		chk.ParseTime = true
		cdb, err := sql.Open("mysql", chk.FormatDSN())
		require.NoError(t, err)
		cdb.SetMaxOpenConns(4)
		cdb.SetMaxIdleConns(4)
		cdb.SetConnMaxIdleTime(time.Second) // a node restart leaves dead idle connections
		t.Cleanup(func() { cdb.Close() })
		c.check[n] = cdb
	}
	require.NoError(t, orderservice.Setup(ctx, c.app[1], "mysql"))
	for n, db := range c.check {
		var skus int
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sku").Scan(&skus), "node %d", n)
		require.Equal(t, orderservice.LastSKU-orderservice.FirstSKU+1, skus, "node %d lacks the seeded catalog", n)
	}
	return c
}

// causal returns cfg for sessions whose reads wait until the node has
// applied every write committed anywhere in the cluster before the read
// (wsrep_sync_wait=1).
func causal(cfg *mysql.Config) *mysql.Config {
	cfg = cfg.Clone()
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wsrep_sync_wait"] = "1"
	return cfg
}

// nodes returns 1..n.
func (c *cluster) nodes() []int {
	out := make([]int, len(c.addrs))
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func wsrepStatus(t *testing.T, db *sql.DB, names ...string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep_%'")
	require.NoError(t, err)
	defer rows.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		if k = strings.ToLower(k); want[k] {
			out[k] = v
		}
	}
	require.NoError(t, rows.Err())
	return out
}

// conflictCounters are a node's Galera conflict counters: transactions that
// failed certification at COMMIT, and local transactions aborted by a
// replicated one (brute-force aborts).
type conflictCounters struct{ certFailures, bfAborts int64 }

// conflicts reads every reachable node's counters; a down node reads zero.
func (c *cluster) conflicts(t *testing.T) map[int]conflictCounters {
	t.Helper()
	out := map[int]conflictCounters{}
	for _, n := range c.nodes() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := c.check[n].QueryContext(ctx, "SHOW GLOBAL STATUS WHERE variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')")
		if err != nil {
			cancel()
			continue
		}
		var cc conflictCounters
		for rows.Next() {
			var k string
			var v int64
			if rows.Scan(&k, &v) == nil {
				if strings.EqualFold(k, "wsrep_local_cert_failures") {
					cc.certFailures = v
				} else {
					cc.bfAborts = v
				}
			}
		}
		rows.Close()
		cancel()
		out[n] = cc
	}
	return out
}

// conflictsSince formats the counters' growth per node.
func (c *cluster) conflictsSince(t *testing.T, before map[int]conflictCounters) string {
	after := c.conflicts(t)
	var parts []string
	for _, n := range c.nodes() {
		a, b, note := after[n], before[n], ""
		if a.certFailures < b.certFailures || a.bfAborts < b.bfAborts {
			b, note = conflictCounters{}, " (since its restart)"
		}
		parts = append(parts, fmt.Sprintf("node %d: %d cert failures, %d BF aborts%s", n, a.certFailures-b.certFailures, a.bfAborts-b.bfAborts, note))
	}
	return strings.Join(parts, "; ")
}

// orderRow is what a node holds for one idempotency key.
type orderRow struct {
	count   int
	orderNo string
}

// orders reads, with a causal read on node n, the orders of scope by key.
func (c *cluster) orders(t *testing.T, n int, scope string) map[string]orderRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rows *sql.Rows
	var err error
	// The first statement on a pool after a node restart may meet a dead
	// connection; database/sql retries those, but a node still joining
	// refuses reads (1047) for a moment.
	for attempt := 0; ; attempt++ {
		rows, err = c.check[n].QueryContext(ctx,
			`SELECT idempotency_key, COUNT(*), MIN(order_no) FROM purchase_order WHERE scope = ? GROUP BY idempotency_key`, scope)
		if err == nil || attempt == 20 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	require.NoError(t, err, "read orders on node %d", n)
	defer rows.Close()
	out := map[string]orderRow{}
	for rows.Next() {
		var key sql.NullString
		var r orderRow
		require.NoError(t, rows.Scan(&key, &r.count, &r.orderNo))
		out[key.String] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// verifyOrders checks, on each of nodes, the orders of scope against the
// answers the clients received: no key has two orders, and every node holds
// the order each 201 named. Once the load has stopped (settled), also:
// every node holds the same orders, and no key whose answers all said
// "nothing was recorded" (500) has an order. (While clients still write,
// the nodes are read one after another and differ by what committed in
// between.) It returns the first node's orders.
func (c *cluster) verifyOrders(t *testing.T, nodes []int, scope string, answers []answer, settled bool) map[string]orderRow {
	t.Helper()
	held := map[int]map[string]orderRow{}
	for _, n := range nodes {
		held[n] = c.orders(t, n, scope)
	}
	first := held[nodes[0]]
	for _, n := range nodes {
		for key, r := range held[n] {
			if r.count != 1 {
				t.Errorf("node %d: key %s has %d orders", n, key, r.count)
			}
			if f, ok := first[key]; settled && (!ok || f.orderNo != r.orderNo) {
				t.Errorf("node %d holds order %s for key %s; node %d holds %+v", n, r.orderNo, key, nodes[0], f)
			}
		}
		if settled && len(held[n]) != len(first) {
			t.Errorf("node %d holds %d orders, node %d holds %d", n, len(held[n]), nodes[0], len(first))
		}
	}
	failedOnly := map[string]bool{}
	for _, a := range answers {
		switch {
		case a.status == 201:
			failedOnly[a.key] = false
			for _, n := range nodes {
				if r, ok := held[n][a.key]; !ok || r.orderNo != a.orderNo {
					t.Errorf("node %d: key %s was answered 201 with order %s (instance %d) but the node holds %+v",
						n, a.key, a.orderNo, a.instance, r)
				}
			}
		case a.status == 500:
			if _, seen := failedOnly[a.key]; !seen {
				failedOnly[a.key] = true
			}
		default:
			failedOnly[a.key] = false
		}
	}
	for key, only500 := range failedOnly {
		if r, ok := first[key]; settled && ok && only500 {
			t.Errorf("key %s was only ever answered 500 (nothing recorded) but order %s committed", key, r.orderNo)
		}
	}
	return first
}

// newKey returns a fresh idempotency key with a readable prefix.
func newKey(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// errIs is errors.Is with a message naming the error found.
func errIs(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got %v, want %v", what, err, target)
	}
}
