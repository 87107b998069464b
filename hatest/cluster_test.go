package hatest_test

// The cluster under test, as scripts/patroni.sh manages it: its URLs, its
// Patroni REST APIs, and the script that kills and restarts its nodes.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/postgres"
)

const (
	// envURL is the cluster's pgx URL through HAProxy.
	envURL = "IDEMPOTENCY_PATRONI_URL"
	// envRequire turns a missing cluster into a failure (CI).
	envRequire = "IDEMPOTENCY_REQUIRE_PATRONI"
)

type cluster struct {
	script   string
	proxyURL string   // through HAProxy, to the primary
	multiURL string   // the three nodes, target_session_attrs=read-write
	apis     []string // Patroni's REST API of node 1, 2, 3
	rest     *http.Client
}

// unavailable skips the test, or fails it under IDEMPOTENCY_REQUIRE_PATRONI=1.
func unavailable(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv(envRequire) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// newCluster returns the cluster of IDEMPOTENCY_PATRONI_URL, healthy: the
// script's start is a no-op on a healthy cluster and brings back a node an
// earlier test left down. It skips (or fails, see unavailable) without the
// variable, and skips when the cluster is not the one scripts/patroni.sh
// manages: the tests kill its nodes through the script.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	proxyURL := os.Getenv(envURL)
	if proxyURL == "" {
		unavailable(t, envURL+` is not set: run scripts/patroni.sh start, then IDEMPOTENCY_PATRONI_URL="$(scripts/patroni.sh url)"`)
	}
	script, err := filepath.Abs(filepath.Join("..", "scripts", "patroni.sh"))
	require.NoError(t, err)
	c := &cluster{script: script, proxyURL: proxyURL, rest: &http.Client{Timeout: time.Second}}
	if managed := c.output(t, "url"); managed != proxyURL {
		t.Skipf("the cluster under test (%s) is not the one scripts/patroni.sh manages (%s, from PATRONI_PORT): cannot kill its nodes",
			proxyURL, managed)
	}
	c.run(t, "start")
	c.multiURL = c.output(t, "urls")
	c.apis = strings.Split(c.output(t, "apis"), ",")
	require.Len(t, c.apis, 3)
	require.True(t, c.synchronous(t), "Patroni's synchronous_mode is off: an acknowledged order may be lost by a failover (docs/postgres-ha.md)")
	return c
}

// synchronous reports whether the cluster's dynamic configuration (GET
// /config) has synchronous_mode on, which the suite's guarantee of no lost
// acknowledged order rests on.
func (c *cluster) synchronous(t *testing.T) bool {
	t.Helper()
	resp, err := c.rest.Get(c.apis[0] + "/config")
	require.NoError(t, err)
	defer resp.Body.Close()
	var cfg struct {
		SynchronousMode bool `json:"synchronous_mode"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&cfg))
	return cfg.SynchronousMode
}

// output runs the script with args and returns what it printed.
func (c *cluster) output(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.script, args...).Output()
	require.NoError(t, err, "patroni.sh %s", strings.Join(args, " "))
	return strings.TrimSpace(string(out))
}

// run runs the script with args and logs its output.
func (c *cluster) run(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	out, err := exec.CommandContext(ctx, c.script, args...).CombinedOutput()
	t.Logf("patroni.sh %s (%v):\n%s", strings.Join(args, " "), time.Since(began).Round(100*time.Millisecond),
		strings.TrimRight(string(out), "\n"))
	require.NoError(t, err, "patroni.sh %s", strings.Join(args, " "))
}

// member is a node as Patroni's GET /cluster reports it.
type member struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // leader, sync_standby, replica
	State    string `json:"state"`
	Timeline int    `json:"timeline"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
}

// node is the member's node number (its name is nodeN).
func (m member) node() int {
	n, _ := strconv.Atoi(strings.TrimPrefix(m.Name, "node"))
	return n
}

// members asks the nodes' REST APIs in turn for the cluster's members.
func (c *cluster) members() ([]member, error) {
	var lastErr error
	for _, api := range c.apis {
		resp, err := c.rest.Get(api + "/cluster")
		if err != nil {
			lastErr = err
			continue
		}
		var body struct {
			Members []member `json:"members"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err == nil {
			return body.Members, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// leader returns the leading member.
func (c *cluster) leader(t *testing.T) member {
	t.Helper()
	ms, err := c.members()
	require.NoError(t, err, "Patroni's REST API")
	for _, m := range ms {
		if m.Role == "leader" {
			return m
		}
	}
	t.Fatalf("no leader among %+v", ms)
	return member{}
}

// newLeader polls Patroni's REST API until a node other than before leads
// on a later timeline, as a failover leaves the cluster, and returns it; it
// fails the test after within.
func (c *cluster) newLeader(t *testing.T, before member, within time.Duration) member {
	t.Helper()
	deadline := time.Now().Add(within)
	var last []member
	for time.Now().Before(deadline) {
		ms, err := c.members()
		if err == nil {
			last = ms
			for _, m := range ms {
				if m.Role == "leader" && m.Name != before.Name && m.Timeline > before.Timeline {
					return m
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no node other than %s leads on a timeline after %d within %v; members: %+v", before.Name, before.Timeline, within, last)
	return member{}
}

// isPrimary reports whether node n's Patroni answers GET /primary with 200,
// as it does on the leader only (HAProxy's health check).
func (c *cluster) isPrimary(n int) bool {
	resp, err := c.rest.Get(c.apis[n-1] + "/primary")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// watchPrimary polls the nodes' GET /primary every 20 ms: first until node
// old no longer answers 200 (lost), then until another node does (gained,
// by node). It sends what it saw; gained is zero if within ran out first.
func (c *cluster) watchPrimary(old int, within time.Duration) <-chan primaryGap {
	ch := make(chan primaryGap, 1)
	go func() {
		var g primaryGap
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if g.lost.IsZero() {
				if !c.isPrimary(old) {
					g.lost = time.Now()
				}
			} else {
				for n := 1; n <= len(c.apis); n++ {
					if n != old && c.isPrimary(n) {
						g.gained, g.node = time.Now(), n
						ch <- g
						return
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		ch <- g
	}()
	return ch
}

// primaryGap is a time without a primary, as Patroni's REST API showed it.
type primaryGap struct {
	lost, gained time.Time
	node         int // the new primary
}

// switchover asks Patroni (POST /switchover on the leader) to hand the
// leadership to the synchronous standby, the only candidate synchronous
// mode allows; Patroni answers once the standby is promoted.
func (c *cluster) switchover(t *testing.T, leader member) {
	t.Helper()
	ms, err := c.members()
	require.NoError(t, err)
	candidate := ""
	for _, m := range ms {
		if m.Role == "sync_standby" {
			candidate = m.Name
		}
	}
	require.NotEmpty(t, candidate, "a synchronous standby among %+v", ms)
	body := fmt.Sprintf(`{"leader":%q,"candidate":%q}`, leader.Name, candidate)
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Post(c.apis[leader.node()-1]+"/switchover", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	t.Logf("POST /switchover %s: %d %s", body, resp.StatusCode, answer)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// freshSchema creates a schema of its own for the test on the primary and
// returns its name; it is dropped when the test ends.
func (c *cluster) freshSchema(t *testing.T) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "hatest_" + hex.EncodeToString(b[:])
	admin := c.admin(t)
	_, err := admin.Exec("CREATE SCHEMA " + schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		// A pool of its own: the test's may hold connections to a node
		// that was killed since.
		db, err := postgres.Open(c.proxyURL)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer db.Close()
		if _, err := db.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// admin opens a pool on the primary through HAProxy, closed when the test
// ends.
func (c *cluster) admin(t *testing.T) *sql.DB {
	t.Helper()
	db, err := postgres.Open(c.proxyURL)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// inSchema returns the URL dsn (which has a query) with search_path set to
// schema.
func inSchema(dsn, schema string) string {
	return fmt.Sprintf("%s&search_path=%s", dsn, schema)
}
