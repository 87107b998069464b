package postgres_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/paymenttest"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// The payment state machine (the root package's order_payment.go) on
// PostgreSQL through PostgresOrders: the conformance suite paymenttest,
// which the root package's order_payment_test.go runs on MariaDB.
func TestPayment_Postgres(t *testing.T) {
	t.Parallel()
	paymenttest.Exercise(t, paymenttest.Engine{
		Open:         func(t *testing.T) *sql.DB { return newPostgres(t) },
		Orders:       idempotency.PostgresOrders,
		Placeholder:  "$1",
		ConnectionID: "SELECT pg_backend_pid()",
		LockWaits:    `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`,
		// pg_stat_activity is live, so it may be polled often.
		LockWaitPoll: time.Millisecond,
		Counted:      countedPostgres,
	})
}

// countedPostgres opens a migrated database as postgres.OpenDB does, whose
// connections count what they send (a pipelined batch once).
func countedPostgres(t *testing.T) (*sql.DB, func() int) {
	_, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	tr := &sends{}
	cfg.Tracer = tr
	db := postgres.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, postgres.Migrate(context.Background(), db))
	return db, func() int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.log)
	}
}
