package paymenttest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Statements ApplyPayment sends inside the caller's transaction, per path
// (the caller's BEGIN, idempotency record and COMMIT are not counted). A
// path that gains a statement fails here. Before the first success's short
// path (order_payment_apply.go, applySuccess) the counts were:
//
//	path                                      before   now
//	first success of a CREATED order          8        4
//	a refund before its payment's success     5        4
//	the success after that refund             9        8
//	a partial refund of a settled payment     6        5
//
// The first success is LockOrder, InsertEvent (APPLIED),
// InsertSettledPayment and UpdateOrderFacts; it was LockOrder,
// InsertPendingPayment, LockPayment, InsertEvent (PENDING),
// SelectPendingRefunds, SettlePayment, UpdateOrderFacts and
// UpdateEventOutcome. The refund first is SelectPaymentOrder,
// InsertPendingPayment, LockPayment and InsertEvent (PENDING: its outcome
// is no longer written twice); the success after it meets the payment's
// row (InsertSettledPayment inserts nothing) and takes the locking path
// (LockPayment, SelectPendingRefunds, the refund's UpdateEventOutcome,
// SettlePayment), its own event row claimed APPLIED.
var statementCases = []struct {
	name   string
	before []func(r run) idempotency.PaymentEvent
	event  func(r run) idempotency.PaymentEvent
	want   int
}{
	{"first success of a CREATED order", nil,
		func(r run) idempotency.PaymentEvent { return r.success(1500) }, 4},
	{"a refund before its payment's success", nil,
		func(r run) idempotency.PaymentEvent { return r.refund("r", 500) }, 4},
	{"the success after a refund that waits for it",
		[]func(r run) idempotency.PaymentEvent{func(r run) idempotency.PaymentEvent { return r.refund("r", 500) }},
		func(r run) idempotency.PaymentEvent { return r.success(1500) }, 8},
	{"a partial refund of a settled payment",
		[]func(r run) idempotency.PaymentEvent{func(r run) idempotency.PaymentEvent { return r.success(1500) }},
		func(r run) idempotency.PaymentEvent { return r.refund("r", 500) }, 5},
}

// exerciseStatements runs the specification of how many statements each
// common path sends, on a database whose connections count them
// (Engine.Counted), and of the race the first success's short path falls
// back from.
func exerciseStatements(t *testing.T, e Engine) {
	t.Run("CommonPaths_SendTheirStatementsAndNoMore", func(t *testing.T) {
		t.Parallel()
		if e.Counted == nil {
			t.Skip("Engine.Counted is nil: the engine's statements are not counted")
		}
		db, sent := e.Counted(t)
		b := &bundle{db: db, orders: e.Orders, engine: e}
		ctx := context.Background()
		for i, tc := range statementCases {
			t.Run(tc.name, func(t *testing.T) {
				// Twice, counting the second: a driver that prepares a
				// statement on its first use sends it once more then.
				var got int
				for round := range 2 {
					r := run(fmt.Sprintf("-n%d.%d", i, round))
					b.createOrder(t, r)
					for _, ev := range tc.before {
						b.apply(t, ev(r))
					}
					b.inTx(t, func(tx *sql.Tx) error {
						from := sent()
						_, err := b.orders.ApplyPayment(ctx, tx, tc.event(r))
						got = sent() - from
						return err
					})
				}
				require.Equal(t, tc.want, got, "statements")
			})
		}
	})

	// The first success of a CREATED order inserts its payment settled
	// without reading it first; a refund that created the payment's row
	// (PENDING, waiting for the success) and has not committed is met by
	// that insert, which waits for it, inserts nothing, and falls back to
	// the locking path: the success applies the refund that waited.
	t.Run("FirstSuccessMeetingARefundCreatingItsPayment_AppliesTheRefund", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		waited, conflicts := race(t, b, r, stepRefund500, stepSuccess)
		require.True(t, waited, "the success waits for the refund's payment row")
		require.LessOrEqual(t, conflicts, 1, "REPEATABLE READ may refuse the row once; the retry reads it")
		requireEnd(t, b, r, idempotency.OrderPaid, 500, 0)
		p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
		require.NoError(t, err)
		require.Equal(t, 2, p.EventsApplied, "the success and the refund")
		require.Equal(t, []string{
			"stripe E-r-500 REFUNDED P  O 500 CNY d-r-500 APPLIED ",
			"stripe E-s SUCCEEDED P  O 1500 CNY d-s APPLIED ",
		}, b.facts(t, r).Events)
	})
}
