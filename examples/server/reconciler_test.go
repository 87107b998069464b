package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// TestNewReconciler_TakesIntervalAndRetentionFromTheFlags: a record the
// reconciler finishes lives -retention like any other, not the Reconciler's
// 24h default; -reconcile-interval 0 turns it off.
func TestNewReconciler_TakesIntervalAndRetentionFromTheFlags(t *testing.T) {
	t.Parallel()
	f, err := parseFlags([]string{"-retention", "2h", "-reconcile-interval", "3s"})
	require.NoError(t, err)
	r := newReconciler(f, nil, nil, new(orderservice.Service), nil)
	require.NotNil(t, r)
	require.Equal(t, 2*time.Hour, r.Retention)
	require.Equal(t, 3*time.Second, r.Interval)
	require.NotNil(t, r.Recover)

	f, err = parseFlags([]string{"-reconcile-interval", "0"})
	require.NoError(t, err)
	require.Nil(t, newReconciler(f, nil, nil, new(orderservice.Service), nil))
}

// TestServer_ReconcilerBackfill_LivesTheRetentionFlag: the running server's
// reconciler finishes an abandoned claim whose order committed, and the
// record expires -retention after that, by the database's clock.
func TestServer_ReconcilerBackfill_LivesTheRetentionFlag(t *testing.T) {
	t.Parallel()
	db, dsn := testdb.MySQL(t)
	s := newCrashServer(t, "mysql://"+dsn, "claim-first", "-retention", "1h")
	s.start("") // it migrates and seeds the database

	ctx := context.Background()
	store := idempotency.NewMySQLStore(db)
	_, err := store.Claim(ctx, idempotency.Claim{Scope: "7", Key: "abandoned", Fingerprint: "fp", Owner: "crashed/1",
		Lease: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.CreateOrder(ctx, tx, &idempotency.Order{
		OrderNo: "O-ABANDONED", Scope: "7", IdempotencyKey: "abandoned", UserID: 7, SKUID: 20001, Quantity: 1,
		UnitPriceCents: 1000, TotalCents: 1000,
	}))
	require.NoError(t, tx.Commit())
	// The attempt died: its lease runs out only now, after the order
	// committed, so the reconciler cannot release the key in between.
	_, err = db.Exec(`UPDATE idempotency_record SET locked_until = NOW(6) - INTERVAL 1 SECOND WHERE idempotency_key = 'abandoned'`)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		rec, err := store.Lookup(ctx, "7", "abandoned")
		return err == nil && rec.Status == idempotency.StatusDone
	}, 10*crashTestReconcile+5*time.Second, 50*time.Millisecond, "the reconciler finishes the record")

	var lives int64
	require.NoError(t, db.QueryRow(`SELECT TIMESTAMPDIFF(SECOND, updated_at, expires_at) FROM idempotency_record
WHERE idempotency_key = 'abandoned'`).Scan(&lives))
	require.Equal(t, int64(time.Hour/time.Second), lives, "seconds from the backfill to the record's expiry")
}

// -migrate=false leaves the schema to whoever put it in place (behind
// PgBouncer's transaction pooling, a run on a direct connection): on an
// empty database the server starts and creates no table; once the schema
// is there, the same server creates orders.
func TestServer_MigrateFalse_CreatesNoTableAndServesOnceTheSchemaIsThere(t *testing.T) {
	db, dsn := testdb.MySQL(t)
	srv := newCrashServer(t, "mysql://"+dsn, "claim-first", "-migrate=false")
	srv.start("")
	var tables int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&tables))
	require.Zero(t, tables, "-migrate=false must not create a table")

	require.NoError(t, orderservice.Setup(t.Context(), db, "mysql"))
	a := newCrashCreate(1, "migrate-false").send(&http.Client{Timeout: 10 * time.Second}, srv.url("/orders"))
	require.NoError(t, a.err)
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
}
