package postgres_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/paymenttest"
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
	})
}
