package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// fleetInstance is another instance of the order service over b's database,
// with its own middleware (and so its own replay cache and replay hint). It
// counts the create handler's executions, the ones rolled back included, and
// the create route's replays by where they came from.
type fleetInstance struct {
	*testBundle
	executions atomic.Int64
	mu         sync.Mutex
	from       map[idempotency.ReplaySource]int
}

func addInstance(t *testing.T, b *testBundle, cfg idempotency.Config) *fleetInstance {
	t.Helper()
	in := &fleetInstance{from: map[idempotency.ReplaySource]int{}}
	cfg.Observer = idempotency.ObserverFunc(func(_ context.Context, e idempotency.Event) {
		if e.Final && e.Outcome == idempotency.OutcomeReplayed && e.Route == "create_order" {
			in.mu.Lock()
			in.from[e.From]++
			in.mu.Unlock()
		}
	})
	svc, err := orderservice.New(b.db, orderservice.Options{
		Idempotency: true, Store: idempotency.NewMySQLStore(b.db), Config: cfg,
		AfterCreate: func(context.Context) error { in.executions.Add(1); return nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	in.testBundle = &testBundle{db: b.db, srv: srv}
	return in
}

func (in *fleetInstance) replaysFrom(s idempotency.ReplaySource) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.from[s]
}

// A retry of a finished key that reaches an instance whose cache cannot
// answer it (here: off) reads the record and replays it: the handler does
// not run, not even to be rolled back. A changed request is still refused.
func TestSinglePhase_RetryOnInstanceWithoutCache_ReplaysWithoutExecuting(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 0)
	other := addInstance(t, b, idempotency.Config{Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1})
	create := call{user: "7", key: "k", body: createBody(7, 20001, 1, `,"coupon_id":21`)}

	first := b.do(t, create)
	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	for range 3 {
		again := other.do(t, create)
		require.Equal(t, http.StatusCreated, again.Status, again.Body)
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	}
	changed := other.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 2, "")})
	require.Equal(t, http.StatusConflict, changed.Status)
	require.Equal(t, idempotency.ProblemKeyReused, changed.problemType(t))

	require.Zero(t, other.executions.Load(), "no retry executed the handler")
	require.Equal(t, 3, other.replaysFrom(idempotency.ReplayFromStore))
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.records(t))
}

// The replay that read the record caches it: the next retry on that
// instance is answered from its cache, and the Observer says which.
func TestSinglePhase_RetryOnAnotherInstance_IsCachedThere(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 0)
	other := addInstance(t, b, idempotency.Config{Mode: idempotency.ModeSinglePhase})
	create := call{user: "7", key: "k", body: createBody(7, 20001, 1, "")}
	first := b.do(t, create)
	require.Equal(t, http.StatusCreated, first.Status, first.Body)

	for range 2 {
		again := other.do(t, create)
		require.Equal(t, http.StatusCreated, again.Status, again.Body)
		require.Equal(t, first.Body, again.Body)
	}
	require.Equal(t, 1, other.replaysFrom(idempotency.ReplayFromStore))
	require.Equal(t, 1, other.replaysFrom(idempotency.ReplayFromCache))
	require.Zero(t, other.executions.Load())
}

// A key past its retention is new again on an instance that reads the
// record first: the read finds the expired record, and the key is renewed
// the claim-first way (a fenced takeover), executing exactly once however
// many requests renew it at once.
func TestSinglePhase_RetryPastRetentionOnInstanceWithoutCache_RenewsAndExecutesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase, Lease: time.Second, Retention: time.Second}, 0)
	other := addInstance(t, b, idempotency.Config{Mode: idempotency.ModeSinglePhase, Lease: time.Second, Retention: time.Hour, ReplayCacheBytes: -1})
	first := b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, "")})
	require.Equal(t, http.StatusCreated, first.Status)
	require.Eventually(t, func() bool {
		return b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE expires_at <= NOW(6)") == 1
	}, 5*time.Second, 20*time.Millisecond)
	_, err := b.db.Exec("DELETE FROM purchase_order") // the order table forgets too (an archive job)
	require.NoError(t, err)

	renewal := call{user: "7", key: "k", body: createBody(7, 20002, 2, "")}
	answers := other.storm(t, 16, renewal)
	var created []string
	for _, got := range answers {
		switch got.Status {
		case http.StatusCreated:
			created = append(created, got.Body)
			require.JSONEq(t, created[0], got.Body, "every 201 is the one renewed order")
		case http.StatusConflict:
			require.Equal(t, idempotency.ProblemInProgress, got.problemType(t))
		default:
			t.Fatalf("unexpected answer %d: %s", got.Status, got.Body)
		}
	}
	require.NotEmpty(t, created)
	require.NotEqual(t, first.Body, created[0])
	require.Equal(t, int64(1), other.executions.Load(), "one execution renewed the key")
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM purchase_order WHERE sku_id = 20002 AND quantity = 2"))
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE' AND expires_at > NOW(6)"))
}

// Concurrent first requests for one key, spread over three instances that
// all read the record first (none exists yet): each read misses, all
// execute, and the record's and the order's unique keys still let exactly
// one commit; everyone gets its answer.
func TestSinglePhase_StormAcrossInstancesWithoutCache_OneOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 0)
	cfg := idempotency.Config{Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1}
	instances := []*fleetInstance{addInstance(t, b, cfg), addInstance(t, b, cfg), addInstance(t, b, cfg)}
	create := call{user: "7", key: "storm", body: createBody(7, 20001, 1, `,"coupon_id":11`)}

	answers := make([]answer, 48)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = instances[i%len(instances)].do(t, create)
		}()
	}
	close(start)
	wg.Wait()

	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, a.Body)
		require.Equal(t, answers[0].Body, a.Body)
	}
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.records(t))
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
}
