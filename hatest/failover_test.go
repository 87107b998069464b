package hatest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/logcount"
)

const (
	// workers are the clients, each creating orders with fresh keys,
	// spread over the three instances.
	workers = 6
	// warmUp and settle are load windows before the leader fails and
	// after the first write on the new primary.
	warmUp = 2 * time.Second
	settle = 2 * time.Second
	// lease is the middleware's lease: a claim whose attempt died with
	// the primary blocks its key (409 in-progress) until it expires.
	lease = 5 * time.Second
	// noHang bounds every request: the lease, which bounds an attempt's
	// work, plus the connection attempts of the gap.
	noHang = 10 * time.Second
	// keyBudget bounds how long a client keeps retrying one key.
	keyBudget = time.Minute
	// recoverWithin bounds the wait for a new primary, and then for a
	// write on it.
	recoverWithin = time.Minute
	// retryCap caps the client's wait before a retry: Retry-After says 1 s;
	// the clients retry sooner so that the first write after the gap is
	// measured to a fraction of a second.
	retryCap = 200 * time.Millisecond
)

// fault is what befalls the leader: it returns once done.
type fault struct {
	what string
	do   func(t *testing.T, c *cluster, leader member)
}

// kill SIGKILLs the leader's Patroni and postmaster, as a crash of its
// machine would. The node stays down: the next test's newCluster brings it
// back (scripts/patroni.sh start), and after the last one stop removes it.
var kill = fault{"leader killed", func(t *testing.T, c *cluster, leader member) {
	c.run(t, "kill", strconv.Itoa(leader.node()))
}}

// switchover asks Patroni to hand the leadership to the synchronous
// standby, as an operator does before maintenance: the leader stops
// PostgreSQL, the standby is promoted, the old leader restarts as a
// replica.
var switchover = fault{"switchover", func(t *testing.T, c *cluster, leader member) {
	c.switchover(t, leader)
}}

// TestSwitchover_MultiHostURL_NoLostNoDuplicateOnly503Or409: a planned
// switchover under load, the pools' URL listing the three nodes with
// target_session_attrs=read-write: for a moment every node is a standby
// (see demoted_test.go). Claim-first.
func TestSwitchover_MultiHostURL_NoLostNoDuplicateOnly503Or409(t *testing.T) {
	c := newCluster(t)
	testFailover(t, c, "multi-host URL", c.multiURL, idempotency.ModeClaimFirst, switchover)
}

// TestFailover_ThroughHAProxy_LeaderKilled_NoLostNoDuplicateOnly503Or409:
// three instances of the service write through HAProxy, which routes to the
// node whose Patroni answers GET /primary; the leader's Patroni and
// postmaster are killed with SIGKILL under load. Claim-first.
func TestFailover_ThroughHAProxy_LeaderKilled_NoLostNoDuplicateOnly503Or409(t *testing.T) {
	c := newCluster(t)
	testFailover(t, c, "HAProxy", c.proxyURL, idempotency.ModeClaimFirst, kill)
}

// TestFailover_MultiHostURL_LeaderKilled_NoLostNoDuplicateOnly503Or409: the
// same without a proxy: each pool's URL lists the three nodes with
// target_session_attrs=read-write, and pgx connects to the first that
// takes writes. Single-phase.
func TestFailover_MultiHostURL_LeaderKilled_NoLostNoDuplicateOnly503Or409(t *testing.T) {
	c := newCluster(t)
	testFailover(t, c, "multi-host URL", c.multiURL, idempotency.ModeSinglePhase, kill)
}

func testFailover(t *testing.T, c *cluster, way, dsn string, mode idempotency.Mode, f fault) {
	logs := logcount.New()
	logcount.CaptureDefault(t, logs)
	schema := c.freshSchema(t)
	ins := instances(t, inSchema(dsn, schema), idempotency.Config{Mode: mode, Lease: lease}, logs)

	before := c.leader(t)
	l := startLoad(ins)
	t.Cleanup(func() { l.finish() }) // if the test stops early
	time.Sleep(warmUp)
	require.NotZero(t, l.acknowledged(), "orders acknowledged before the %s", f.what)

	// The gap runs from when the old leader's Patroni stops answering
	// GET /primary with 200 (it died, or demoted itself) to when another
	// node's does. A request that began after the gap began cannot have
	// been written by the old primary.
	watch := c.watchPrimary(before.node(), recoverWithin)
	began := time.Now()
	f.do(t, c, before)
	did := time.Since(began)
	p := <-watch
	if p.gained.IsZero() {
		l.finish()
		logs.Log(t, "logged", 10)
		t.Fatalf("no node other than %s answered /primary 200 within %v of the %s", before.Name, recoverWithin, f.what)
	}
	// The load goes on until a new order is written on the new primary,
	// and then for settle.
	select {
	case <-l.firstWriteAfter(p.gained):
	case <-time.After(recoverWithin):
		l.finish()
		logs.Log(t, "logged", 10)
		t.Fatalf("no order created within %v of the new primary", recoverWithin)
	}
	time.Sleep(settle)
	answers := l.finish()
	after := c.newLeader(t, before, recoverWithin)
	first := firstWriteSince(answers, p.lost)
	stopped, resumed := writeGap(answers, began)

	// The figures.
	keys := keysOf(answers)
	gap := between(answers, stopped, resumed)
	t.Logf("%s, %s, %s: %d workers over 3 instances; leader node %d (timeline %d), %v into the load (it took %v)",
		way, mode, f.what, workers, before.node(), before.Timeline, warmUp, did.Round(time.Millisecond))
	t.Logf("  without a primary: %v (node %d stopped answering /primary 200 → node %d answered 200)",
		p.gained.Sub(p.lost).Round(10*time.Millisecond), before.node(), p.node)
	t.Logf("  first write: %v after the gap began (a new order acknowledged; instance %d, key %s)",
		first.end.Sub(p.lost).Round(10*time.Millisecond), first.instance, first.key)
	t.Logf("  no new order acknowledged for %v (the clients' longest wait between two, around the %s)",
		resumed.Sub(stopped).Round(10*time.Millisecond), f.what)
	t.Logf("  new leader: node %d, timeline %d", after.node(), after.Timeline)
	t.Logf("  answers overlapping that gap: %s", tally(gap))
	t.Logf("  answers in all: %d requests for %d keys: %s", len(answers), len(keys), tally(answers))
	retried, replayed := retriedKeys(answers)
	t.Logf("  keys retried after a 503 or 409: %d, of which %d were answered by a replay of the order an earlier attempt had committed, %d by the one order a retry created",
		retried, replayed, retried-replayed)
	t.Logf("  slowest request: %v; slowest in the gap: %v", slowest(answers).took().Round(time.Millisecond),
		slowest(gap).took().Round(time.Millisecond))
	logs.Log(t, "logged", 10)

	// No answer outside the contract, and none that hung.
	reportNonConforming(t, answers)
	for _, a := range answers {
		if a.took() > noHang {
			t.Errorf("a request took %v, more than %v: %s", a.took().Round(time.Millisecond), noHang, a)
		}
	}

	// Every key was eventually acknowledged, with one order number.
	acked := map[string]string{}
	for _, a := range answers {
		if a.status != http.StatusCreated {
			continue
		}
		if prev, ok := acked[a.key]; ok && prev != a.orderNo {
			t.Errorf("key %s acknowledged as order %s and as order %s", a.key, prev, a.orderNo)
		}
		acked[a.key] = a.orderNo
	}
	for k := range keys {
		if _, ok := acked[k]; !ok {
			t.Errorf("key %s was never acknowledged within %v of retries: %v", k, keyBudget, keys[k])
		}
	}

	// After recovery, the table holds exactly the acknowledged orders: none
	// lost (each 201 has its row, with the number the client was told),
	// none duplicated (one row per key), none unacknowledged.
	db := c.admin(t)
	rows, err := db.Query(`SELECT idempotency_key, order_no FROM `+schema+`.purchase_order WHERE scope = $1`, scope)
	require.NoError(t, err)
	stored := map[string][]string{}
	for rows.Next() {
		var k, o string
		require.NoError(t, rows.Scan(&k, &o))
		stored[k] = append(stored[k], o)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	lost, dup, extra := 0, 0, 0
	for k, o := range acked {
		switch got := stored[k]; {
		case len(got) == 0:
			lost++
			t.Errorf("lost: order %s (key %s) was acknowledged and is not in the table", o, k)
		case len(got) > 1:
			dup++
			t.Errorf("duplicate: key %s has orders %v", k, got)
		case got[0] != o:
			lost++
			t.Errorf("lost and recreated: key %s was acknowledged as order %s; the table has %s", k, o, got[0])
		}
	}
	for k, o := range stored {
		if _, ok := acked[k]; !ok {
			extra++
			t.Errorf("key %s has orders %v that no client was told of", k, o)
		}
	}
	var done int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+schema+`.idempotency_record WHERE scope = $1 AND status = 'DONE'`, scope).Scan(&done))
	t.Logf("  orders: %d acknowledged, %d in the table; lost %d, duplicated %d, unacknowledged %d; %d DONE records",
		len(acked), len(stored), lost, dup, extra, done)
	require.Equal(t, len(acked), done, "a DONE record per acknowledged key")
}

// load is a set of clients creating orders, each with fresh keys, until
// stopped. A client retries a key after a retryable answer (503, 409
// in-progress), on the next instance, until it is acknowledged or
// keyBudget runs out, as a client following the contract does; a client
// that is stopped first finishes its key.
type load struct {
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	answers []answer
	acked   int
	waiters []waiter
}

// waiter is sent the first new order (201, not a replay) whose request
// started at or after since.
type waiter struct {
	since time.Time
	ch    chan answer
}

func startLoad(ins []*instance) *load {
	ctx, stop := context.WithCancel(context.Background())
	l := &load{stop: stop}
	var run [4]byte
	_, _ = rand.Read(run[:])
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("ha-%s-w%d-%d", hex.EncodeToString(run[:]), w, i)
				sku := orderservice.FirstSKU + int64(i%100)
				giveUp := time.Now().Add(keyBudget)
				for attempt := 1; ; attempt++ {
					a := ins[(w+i+attempt)%len(ins)].create(key, sku)
					a.attempt = attempt
					l.record(a)
					if !retryable(a) || time.Now().After(giveUp) {
						break
					}
					time.Sleep(retryDelay(a))
				}
			}
		}()
	}
	return l
}

func (l *load) record(a answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers = append(l.answers, a)
	if a.status != http.StatusCreated || a.replayed {
		return
	}
	l.acked++
	kept := l.waiters[:0]
	for _, w := range l.waiters {
		if a.start.Before(w.since) {
			kept = append(kept, w)
			continue
		}
		w.ch <- a
	}
	l.waiters = kept
}

// firstWriteAfter returns a channel that gets the first new order whose
// request started at or after since.
func (l *load) firstWriteAfter(since time.Time) <-chan answer {
	ch := make(chan answer, 1)
	l.mu.Lock()
	l.waiters = append(l.waiters, waiter{since: since, ch: ch})
	l.mu.Unlock()
	return ch
}

// acknowledged is how many new orders were acknowledged so far.
func (l *load) acknowledged() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked
}

// finish stops the clients, waits for them to finish their keys, and
// returns every answer.
func (l *load) finish() []answer {
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]answer(nil), l.answers...)
}

// retryDelay is Retry-After, capped at retryCap.
func retryDelay(a answer) time.Duration {
	if s, err := strconv.Atoi(a.retryAfter); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, retryCap)
	}
	return retryCap
}

// keysOf groups the answers' labels by key.
func keysOf(answers []answer) map[string][]string {
	keys := map[string][]string{}
	for _, a := range answers {
		keys[a.key] = append(keys[a.key], a.label())
	}
	return keys
}

// firstWriteSince returns the first new order (201, not a replay) whose
// request started at or after since.
func firstWriteSince(answers []answer, since time.Time) answer {
	var first answer
	for _, a := range answers {
		if a.status == http.StatusCreated && !a.replayed && !a.start.Before(since) &&
			(first.end.IsZero() || a.end.Before(first.end)) {
			first = a
		}
	}
	return first
}

// writeGap returns the longest interval between two consecutive new orders
// (201, not a replay; by the time their answers ended) whose second ended
// after from: as long as the clients could not write.
func writeGap(answers []answer, from time.Time) (stopped, resumed time.Time) {
	var ends []time.Time
	for _, a := range answers {
		if a.status == http.StatusCreated && !a.replayed {
			ends = append(ends, a.end)
		}
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	for i := 1; i < len(ends); i++ {
		if ends[i].After(from) && ends[i].Sub(ends[i-1]) > resumed.Sub(stopped) {
			stopped, resumed = ends[i-1], ends[i]
		}
	}
	return stopped, resumed
}

// retriedKeys counts the keys that took more than one attempt, and those
// of them whose 201 was a replay.
func retriedKeys(answers []answer) (retried, replayed int) {
	attempts := map[string]int{}
	replay := map[string]bool{}
	for _, a := range answers {
		attempts[a.key]++
		if a.status == http.StatusCreated && a.replayed {
			replay[a.key] = true
		}
	}
	for k, n := range attempts {
		if n > 1 {
			retried++
			if replay[k] {
				replayed++
			}
		}
	}
	return retried, replayed
}

// between returns the answers that ended after from and started before to.
func between(answers []answer, from, to time.Time) []answer {
	var out []answer
	for _, a := range answers {
		if a.end.After(from) && a.start.Before(to) {
			out = append(out, a)
		}
	}
	return out
}

func slowest(answers []answer) answer {
	var s answer
	for _, a := range answers {
		if a.took() > s.took() {
			s = a
		}
	}
	return s
}

// reportNonConforming fails the test with every answer outside the
// contract, grouped by what was answered, a few examples each.
func reportNonConforming(t *testing.T, answers []answer) {
	t.Helper()
	byLabel := map[string][]answer{}
	for _, a := range answers {
		if !a.conforms() {
			byLabel[a.label()] = append(byLabel[a.label()], a)
		}
	}
	labels := make([]string, 0, len(byLabel))
	for k := range byLabel {
		labels = append(labels, k)
	}
	sort.Strings(labels)
	for _, k := range labels {
		examples := byLabel[k][:min(3, len(byLabel[k]))]
		lines := make([]string, len(examples))
		for i, a := range examples {
			lines[i] = "    " + a.String()
		}
		t.Errorf("%d answers %s, not 201 nor 503 / 409 in-progress with Retry-After; e.g.\n%s",
			len(byLabel[k]), k, strings.Join(lines, "\n"))
	}
}
