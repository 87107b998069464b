package idempotency_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/paymenttest"
)

// The payment state machine (order_payment.go) on MariaDB/MySQL through
// MySQLOrders: the conformance suite paymenttest, which
// postgres/order_payment_test.go runs on PostgresOrders. At READ
// COMMITTED, as Config.TxOptions gives the payment events, and at
// REPEATABLE READ, InnoDB's default, where the state machine is as
// correct but events of different orders may wait for each other.
func TestPayment_MySQL(t *testing.T) {
	t.Parallel()
	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			paymenttest.Exercise(t, paymenttest.Engine{
				Open:         newMySQL,
				Orders:       idempotency.MySQLOrders,
				Placeholder:  "?",
				ConnectionID: "SELECT CONNECTION_ID()",
				LockWaits:    `SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`,
				// InnoDB refreshes innodb_trx only when it was not read for
				// 0.1 s, so it is polled no faster.
				LockWaitPoll: 150 * time.Millisecond,
				TxOptions:    &sql.TxOptions{Isolation: level},
				OrdersWait:   level == sql.LevelRepeatableRead,
				Counted:      idempotency.CountedMySQL,
			})
		})
	}
}
