package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// In single-phase mode a concurrent duplicate executes too: its own insert
// into purchase_order meets the winner's UNIQUE (scope, key) first, waits for
// the winner's commit, fails, rolls back and replays the winner's answer. So
// every one of 64 concurrent requests gets the same 201, and only one order
// exists.
func TestSinglePhase_64RequestsOneKey_OneOrderAndEveryoneGetsTheSame201(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 50*time.Millisecond)
	answers := b.storm(t, 64, call{user: "7", key: "storm", body: createBody(7, 20001, 1, `,"coupon_id":11`)})

	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.records(t))
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, a.Body)
		require.Equal(t, answers[0].Body, a.Body)
	}
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
}

// A replay that misses the in-process cache (another instance, or an
// evicted entry) replays the first answer, whether it reads the record first
// (replayHint) or executes, meets the finished record at commit and rolls
// back; a changed request is still refused.
func TestSinglePhase_ReplayOnAnotherInstance_ReplaysTheFirstAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 0)
	other, err := orderservice.New(b.db, orderservice.Options{Idempotency: true, Store: idempotency.NewMySQLStore(b.db),
		Config: idempotency.Config{Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1}})
	require.NoError(t, err)
	otherSrv := httptest.NewServer(other)
	t.Cleanup(otherSrv.Close)
	onOther := &testBundle{db: b.db, srv: otherSrv}

	first := b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, `,"coupon_id":21`)})
	require.Equal(t, http.StatusCreated, first.Status)
	for range 2 {
		again := onOther.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, `,"coupon_id":21`)})
		require.Equal(t, http.StatusCreated, again.Status, again.Body)
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	}
	changed := onOther.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 2, "")})
	require.Equal(t, http.StatusConflict, changed.Status)
	require.Equal(t, idempotency.ProblemKeyReused, changed.problemType(t))
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.records(t))
}

// A handler with no unique key of its own: concurrent duplicates all execute
// to the end, then collide on the record's primary key as their
// transaction's last statement, wait for the winner's commit, roll back and
// replay it. Exactly one execution survives. The handler holds every
// execution until a second one has begun, so the duplicates really do
// execute concurrently: without the barrier a duplicate that arrives after
// the winner's commit reads the record first (replayHint) and replays
// without executing, which proves nothing about the collision.
func TestSinglePhase_HandlerWithoutItsOwnUniqueKey_CollidesOnTheRecord(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	_, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: idempotency.ModeSinglePhase})
	require.NoError(t, err)
	var executions atomic.Int64
	second := make(chan struct{}) // closed when a second execution has begun
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		if executions.Add(1) == 2 {
			close(second)
		}
		select {
		case <-second:
		case <-time.After(30 * time.Second):
			http.Error(w, "no second execution began within 30s", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ledger_id":%d}`, id)
	})))
	t.Cleanup(srv.Close)
	b := &testBundle{db: db, srv: srv}

	answers := b.storm(t, 32, call{key: "entry-1", body: `{"amount":5}`})

	require.Greater(t, executions.Load(), int64(1), "the duplicates executed too (the barrier lets none finish before)")
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"), "only the winner's execution committed")
	require.Equal(t, 1, b.records(t))
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, a.Body)
		require.Equal(t, answers[0].Body, a.Body)
	}
}

// A renewal that died leaves a PROCESSING record under an expired lease (and
// no order: its transaction never committed; the cache is off, as it would
// be on another instance). The next single-phase request
// collides with it, takes it over the claim-first way and executes; it is not
// answered in-progress forever.
func TestSinglePhase_ExpiredLeaseOfADeadRenewal_IsTakenOverByTheNextRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase, Lease: time.Second, Retention: time.Hour, ReplayCacheBytes: -1}, 0)
	create := call{user: "7", key: "k", body: createBody(7, 20001, 1, "")}
	first := b.do(t, create)
	require.Equal(t, http.StatusCreated, first.Status)
	_, err := b.db.Exec(`UPDATE idempotency_record SET status = 'PROCESSING', locked_by = 'dead-renewal',
		locked_until = NOW(6) - INTERVAL 1 SECOND, response_status = NULL, response_headers = NULL, response_body = NULL`)
	require.NoError(t, err)
	_, err = b.db.Exec("DELETE FROM purchase_order")
	require.NoError(t, err)

	again := b.do(t, create)
	require.Equal(t, http.StatusCreated, again.Status, again.Body)
	require.Empty(t, again.Header.Get("Idempotent-Replayed"), "it executed")
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE' AND locked_by <> 'dead-renewal'"))
}
