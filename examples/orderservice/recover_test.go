package orderservice_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// Clock edits for each dialect, on the database's own clock: idempotency
// times are DATETIME(6) on MySQL and integer Unix microseconds on SQLite.
var (
	expireRetentionSQL = map[string]string{
		"mysql":  `UPDATE idempotency_record SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE scope = ? AND idempotency_key = ?`,
		"sqlite": `UPDATE idempotency_record SET expires_at = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000 WHERE scope = ? AND idempotency_key = ?`,
	}
	expireLeaseSQL = map[string]string{
		"mysql":  `UPDATE idempotency_record SET locked_until = NOW(6) - INTERVAL 1 SECOND WHERE scope = ? AND idempotency_key = ?`,
		"sqlite": `UPDATE idempotency_record SET locked_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000 WHERE scope = ? AND idempotency_key = ?`,
	}
	// SQLite stamps orders in whole seconds, so an order made a moment ago
	// may carry the takeover's second. A real retention (at least 1s, as
	// Config enforces) puts it a second earlier at least; MySQL's
	// microseconds need no such help.
	ageOrderSQL = map[string]string{
		"sqlite": `UPDATE purchase_order SET created_at = datetime(created_at, '-2 seconds') WHERE scope = ? AND idempotency_key = ?`,
	}
)

// exec runs the bundle's dialect's statement of stmts, if it has one.
func (b *orderBundle) exec(t *testing.T, stmts map[string]string, scope, key string) {
	t.Helper()
	stmt, ok := stmts[b.dialect]
	if !ok {
		return
	}
	_, err := b.db.Exec(stmt, scope, key)
	require.NoError(t, err)
}

// TestRecover_RenewedKeyAfterRetention_CrashedAttempt_IsReleasedNotGivenThePreviousOrder:
// key K made an order; its record outlived retention; a renewed attempt took
// K over and crashed. The reconciler must release K, not finish the renewed
// attempt with the previous period's order. The retry then executes and the
// table's UNIQUE (scope, idempotency_key) answers 409 duplicate-order.
func TestRecover_RenewedKeyAfterRetention_CrashedAttempt_IsReleasedNotGivenThePreviousOrder(t *testing.T) {
	t.Parallel()
	for _, dialect := range orderDialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// Retention ends here by SQL, not by the clock: the replay cache,
			// which trusts the retention it was told, would still answer
			// the first request's key from memory.
			b := startOrderService(t, dialect, orderservice.Options{Idempotency: true,
				Config: idempotency.Config{ReplayCacheBytes: -1}})
			first := b.create(t, "7", "K", `{"user_id":7,"sku_id":20001,"quantity":1}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			b.exec(t, ageOrderSQL, "7", "K")
			b.exec(t, expireRetentionSQL, "7", "K")

			// The renewed attempt claims K as the middleware would: the claim
			// meets the expired record and takes it over.
			renewed := idempotency.Claim{Scope: "7", Key: "K", Fingerprint: "fp-renewed", Owner: "renewed/1",
				Lease: time.Minute, Retention: time.Hour}
			_, err := b.store.Claim(ctx, renewed)
			require.ErrorIs(t, err, idempotency.ErrKeyClaimed)
			old, err := b.store.Lookup(ctx, "7", "K")
			require.NoError(t, err)
			require.True(t, old.Expired)
			_, err = b.store.TakeOver(ctx, renewed, idempotency.Lease{Scope: "7", Key: "K", Owner: old.Owner, Version: old.Version})
			require.NoError(t, err)
			// ...and crashes: its lease runs out with the record PROCESSING.
			b.exec(t, expireLeaseSQL, "7", "K")

			r := &idempotency.Reconciler{Store: b.store, Recover: b.svc.Recover}
			recovered, reclaimed, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 0, recovered, "the previous period's order must not finish the renewed attempt")
			require.Equal(t, 1, reclaimed)
			_, err = b.store.Lookup(ctx, "7", "K")
			require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "K is released")

			retry := b.create(t, "7", "K", `{"user_id":7,"sku_id":20002,"quantity":3}`)
			require.Equal(t, http.StatusConflict, retry.status, retry.body)
			require.Equal(t, "duplicate-order", retry.problemKind(t))
			require.Equal(t, 1, b.orders(t), "purchase_order rows")
		})
	}
}

// TestRecover_CrashAfterTheOrderCommittedOnAFreshKey_FinishesTheRecordWithThatOrder:
// the positive case. The order committed but its record stayed PROCESSING
// (the attempt died): the reconciler finishes the record with the order's
// 201. On SQLite the order's whole-second stamp often shares the claim's
// second, or falls just before the claim's exact time: still its period.
func TestRecover_CrashAfterTheOrderCommittedOnAFreshKey_FinishesTheRecordWithThatOrder(t *testing.T) {
	t.Parallel()
	for _, dialect := range orderDialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := startOrderService(t, dialect, orderservice.Options{Idempotency: true})

			_, err := b.store.Claim(ctx, idempotency.Claim{Scope: "7", Key: "F", Fingerprint: "fp", Owner: "crashed/1",
				Lease: time.Minute, Retention: time.Hour})
			require.NoError(t, err)
			tx, err := b.db.Begin()
			require.NoError(t, err)
			require.NoError(t, idempotency.CreateOrder(ctx, tx, &idempotency.Order{
				OrderNo: "O-FRESH", Scope: "7", IdempotencyKey: "F", UserID: 7, SKUID: 20001, Quantity: 1,
				UnitPriceCents: 1000, TotalCents: 1000,
			}))
			require.NoError(t, tx.Commit())
			b.exec(t, expireLeaseSQL, "7", "F")

			r := &idempotency.Reconciler{Store: b.store, Recover: b.svc.Recover}
			recovered, reclaimed, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, recovered)
			require.Equal(t, 0, reclaimed)

			rec, err := b.store.Lookup(ctx, "7", "F")
			require.NoError(t, err)
			require.Equal(t, idempotency.StatusDone, rec.Status)
			require.Equal(t, http.StatusCreated, rec.Snapshot.StatusCode)
			require.Equal(t, "/orders/O-FRESH", rec.Snapshot.Header.Get("Location"))
			var o orderservice.OrderResponse
			require.NoError(t, json.Unmarshal(rec.Snapshot.Body, &o))
			require.Equal(t, "O-FRESH", o.OrderNo)
			require.Equal(t, 1, b.orders(t))
		})
	}
}
