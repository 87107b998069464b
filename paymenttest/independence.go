package paymenttest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// exerciseIndependence runs the specification that events of different
// orders never wait for each other: a provider delivers many orders'
// events at once, and on MySQL-family servers at REPEATABLE READ a
// locking read of a key that does not exist locks the gap around it, so a
// scan of one order's or payment's rows could wait for, and deadlock with,
// another order's uncommitted rows beside it in the index. Each pair runs
// the second event while the first one's transaction is open; its ids sort
// just before the first's, where such a gap lock would meet them.
func exerciseIndependence(t *testing.T, e Engine) {
	t.Run("EventsOfDifferentOrders_NeverWaitForEachOther", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		for i, tc := range []struct {
			name          string
			before        func(t *testing.T, r run) // for both orders
			first, second func(r run) idempotency.PaymentEvent
		}{
			{name: "success, success",
				first:  func(r run) idempotency.PaymentEvent { return r.success(1500) },
				second: func(r run) idempotency.PaymentEvent { return r.success(1500) }},
			{name: "refund before its success, success",
				first:  func(r run) idempotency.PaymentEvent { return r.refund("r", 500) },
				second: func(r run) idempotency.PaymentEvent { return r.success(1500) }},
			{name: "success, refund before its success",
				first:  func(r run) idempotency.PaymentEvent { return r.success(1500) },
				second: func(r run) idempotency.PaymentEvent { return r.refund("r", 500) }},
			{name: "refund, refund",
				before: func(t *testing.T, r run) { b.apply(t, r.success(1500)) },
				first:  func(r run) idempotency.PaymentEvent { return r.refundOf("r", "x", 500) },
				second: func(r run) idempotency.PaymentEvent { return r.refundOf("r", "x", 500) }},
			{name: "refund before its success, refund before its success",
				first:  func(r run) idempotency.PaymentEvent { return r.refundOf("r", "x", 500) },
				second: func(r run) idempotency.PaymentEvent { return r.refundOf("r", "x", 500) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// "-iNb" sorts before "-iNa": the second's order, payment
				// and event ids are the first's neighbours from below.
				r1, r2 := run(fmtRun("-i", i, "b")), run(fmtRun("-i", i, "a"))
				for _, r := range []run{r1, r2} {
					b.createOrder(t, r)
					if tc.before != nil {
						tc.before(t, r)
					}
				}
				second := step{name: "the other order's", apply: func(ctx context.Context, tx *sql.Tx, o idempotency.Orders, _ run) error {
					_, err := o.ApplyPayment(ctx, tx, tc.second(r2))
					return err
				}}
				waited, conflicts := race(t, b, r1, eventStep("first", tc.first), second)
				require.False(t, waited, "the second order's event waited for the first order's transaction")
				require.Zero(t, conflicts, "the second order's event met a conflict with the first order's")
			})
		}
	})
}

func fmtRun(prefix string, i int, suffix string) string {
	return prefix + string(rune('0'+i)) + suffix
}
