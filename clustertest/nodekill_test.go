package clustertest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// galeraScript returns the path of scripts/galera.sh, or skips the test when
// the script does not manage the cluster under test (its DSNs differ).
func galeraScript(t *testing.T, c *cluster) string {
	t.Helper()
	if len(c.addrs) < 3 {
		unavailable(t, fmt.Sprintf("the node-kill test needs 3 nodes; %s lists %d", envDSNs, len(c.addrs)))
	}
	script, err := filepath.Abs(filepath.Join("..", "scripts", "galera.sh"))
	require.NoError(t, err)
	out, err := exec.Command(script, "dsns").Output()
	require.NoError(t, err, "%s dsns", script)
	var managed []string
	for _, dsn := range strings.Split(strings.TrimSpace(string(out)), ",") {
		cfg, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		managed = append(managed, cfg.Addr)
	}
	if strings.Join(managed, ",") != strings.Join(c.addrs, ",") {
		t.Skipf("the cluster under test (%s) is not the one scripts/galera.sh manages (%s, from GALERA_PORT): cannot kill its nodes",
			strings.Join(c.addrs, ","), strings.Join(managed, ","))
	}
	return script
}

// suspectTimeout is how long the nodes take to suspect and evict a dead
// one: GALERA_SUSPECT_TIMEOUT seconds, as scripts/galera.sh configures it.
func suspectTimeout(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv("GALERA_SUSPECT_TIMEOUT")
	if s == "" {
		return 10 * time.Second
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "GALERA_SUSPECT_TIMEOUT")
	return time.Duration(n) * time.Second
}

// galera runs scripts/galera.sh with args and logs its output.
func galera(t *testing.T, script string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	out, err := exec.CommandContext(ctx, script, args...).CombinedOutput()
	t.Logf("galera.sh %s (%v):\n%s", strings.Join(args, " "), time.Since(began).Round(100*time.Millisecond),
		strings.TrimRight(string(out), "\n"))
	require.NoError(t, err, "galera.sh %s", strings.Join(args, " "))
}

// TestNodeKill_UnderLoad_NoDuplicateNoLostOrder: clients create orders
// through two instances, on nodes 1 and 2, while node 2 is killed and later
// restarted. No key gets two orders; every acknowledged order is on the
// surviving nodes while node 2 is down and on all three once it has
// rejoined; the instance on node 1 keeps creating orders; the instance on
// node 2 answers 503 (or 409) with Retry-After while its node is down,
// never 500.
func TestNodeKill_UnderLoad_NoDuplicateNoLostOrder(t *testing.T) {
	const (
		workers = 8 // half on each instance
		warmUp  = 2 * time.Second
		after   = 2 * time.Second
	)
	// Node 2 stays down until well after the others have evicted it; until
	// then they stall their commits.
	down := suspectTimeout(t) + 5*time.Second
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t)
			script := galeraScript(t, c)
			killed := false
			t.Cleanup(func() {
				if killed { // the test stopped half-way: bring node 2 back for whatever runs next
					galera(t, script, "restart", "2")
				}
			})
			// The lease (30 s by default) must outlast the cluster's stall
			// while it evicts the dead node: a shorter one cancels the
			// handlers on node 1 that wait for their commits.
			cfg := idempotency.Config{Mode: m.mode}
			ins := []*instance{c.instance(t, 1, cfg), c.instance(t, 2, cfg)}
			before := c.conflicts(t)

			l := startLoad(workers, 3, "kill", func(w, _ int) *instance { return ins[w%2] })
			t.Cleanup(func() { l.finish() }) // before node 2 is restarted, if the test stops early
			time.Sleep(warmUp)
			var tl timeline
			tl.kill = time.Now()
			killed = true
			galera(t, script, "kill", "2")
			tl.killed = time.Now()
			time.Sleep(down)

			// While node 2 is down: everything acknowledged so far is on
			// nodes 1 and 3.
			c.verifyOrders(t, []int{1, 3}, scope, l.snapshot(), false)
			tl.restart = time.Now()
			galera(t, script, "restart", "2")
			killed = false
			tl.rejoined = time.Now()
			time.Sleep(after)
			answers := l.finish()

			phases := map[string][]answer{}
			for _, a := range answers {
				p := tl.phase(a)
				phases[p] = append(phases[p], a)
			}
			t.Logf("%s node kill: %d workers (4 per instance), node 2 killed %v in, down %v, restarted, %v more",
				m.name, workers, warmUp, down, after)
			for _, p := range []string{"before the kill", "across the kill", "node 2 down", "node 2 rejoining", "after the rejoin"} {
				for _, in := range ins {
					var of []answer
					for _, a := range phases[p] {
						if a.instance == in.node {
							of = append(of, a)
						}
					}
					t.Logf("  %-17s instance %d: %4d answers, max latency %6v: %s", p, in.node, len(of), maxLatency(of), tally(of))
				}
			}
			t.Logf("  galera conflicts: %s", c.conflictsSince(t, before))
			for _, in := range ins {
				in.logCauses(t)
			}

			orders := c.verifyOrders(t, c.nodes(), scope, answers, true)
			t.Logf("  orders on every node after the rejoin: %d; keys: %d", len(orders), countKeys(answers))
			c.checkHistory(t, answers)

			if n := countCreated(answers, 1, tl.killed); n == 0 {
				t.Errorf("the instance on node 1 created no order after node 2 was killed")
			} else {
				t.Logf("  instance 1 created %d orders after the kill", n)
			}
			var down2 []answer
			for _, a := range phases["node 2 down"] {
				if a.instance == 2 {
					down2 = append(down2, a)
				}
			}
			if len(down2) == 0 {
				t.Errorf("the instance on node 2 answered nothing while its node was down")
			}
			for _, a := range down2 {
				if a.status == http.StatusCreated {
					t.Errorf("instance 2 answered 201 while its node was down: %s", a)
				}
			}
			reportNonConforming(t, m.name+", instance 2 while node 2 was down", down2)
			var rest []answer
			for _, a := range answers {
				if a.instance != 2 || tl.phase(a) != "node 2 down" {
					rest = append(rest, a)
				}
			}
			reportNonConforming(t, m.name+", every other answer", rest)
		})
	}
}

// timeline is when the test killed node 2 (the script was called, and
// returned with the node dead) and restarted it (called, and returned with
// the node Synced).
type timeline struct{ kill, killed, restart, rejoined time.Time }

// phase places an answer in the timeline. "node 2 down" holds only the
// requests sent after node 2 died and answered before its restart began.
func (tl timeline) phase(a answer) string {
	switch {
	case a.end.Before(tl.kill):
		return "before the kill"
	case a.start.Before(tl.killed):
		return "across the kill"
	case a.end.Before(tl.restart):
		return "node 2 down"
	case a.start.Before(tl.rejoined):
		return "node 2 rejoining"
	}
	return "after the rejoin"
}

func maxLatency(answers []answer) time.Duration {
	var m time.Duration
	for _, a := range answers {
		m = max(m, a.end.Sub(a.start))
	}
	return m.Round(time.Millisecond)
}

func countKeys(answers []answer) int {
	keys := map[string]bool{}
	for _, a := range answers {
		keys[a.key] = true
	}
	return len(keys)
}
