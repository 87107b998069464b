package paymenttest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// exerciseEvents runs the specifications of events that apply, one after
// the other: a success, refunds and refunded totals, duplicates, a cancel,
// and events refused as invalid.
func exerciseEvents(t *testing.T, e Engine) {
	t.Run("SuccessWithTheOrdersAmountAndCurrency_PaysIt", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		out := b.apply(t, r.success(1500))
		require.Equal(t, idempotency.PaymentOutcome{Applied: true, OrderNo: r.order(), Status: idempotency.OrderPaid}, out)
		p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
		require.NoError(t, err)
		require.Equal(t, &idempotency.Payment{Provider: "stripe", PaymentID: r.payment(), OrderNo: r.order(),
			Status: idempotency.PaymentSettled, AmountCents: 1500, Currency: "CNY", EventsApplied: 1}, p)
	})

	t.Run("PartialRefunds_AccumulateAndKeepPaidUntilWhole", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		b.apply(t, r.success(1500))
		for _, tc := range []struct {
			id       string
			amount   int64
			status   idempotency.OrderStatus
			refunded int64
		}{
			{"a", 500, idempotency.OrderPaid, 500},
			{"b", 700, idempotency.OrderPaid, 1200},
			{"c", 300, idempotency.OrderRefunded, 1500},
		} {
			out := b.apply(t, r.refund(tc.id, tc.amount))
			require.True(t, out.Applied, tc.id)
			require.Equal(t, tc.status, out.Status, tc.id)
			p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
			require.NoError(t, err)
			require.Equal(t, tc.refunded, p.RefundedCents, tc.id)
		}
	})

	// A PAID order's further success events, and any event delivered twice,
	// change nothing.
	t.Run("DuplicateEvents_AreNoOps", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		b.apply(t, r.refund("early", 200)) // pending until the success
		b.apply(t, r.success(1500))
		b.apply(t, r.refund("late", 300))
		before := b.facts(t, r)

		again := r.success(1500)
		again.EventID, again.Digest = r.event("s2"), "d-s2"
		for name, tc := range map[string]struct {
			ev   idempotency.PaymentEvent
			want idempotency.PaymentOutcome
		}{
			"the success again": {r.success(1500), idempotency.PaymentOutcome{Duplicate: true, Applied: true, OrderNo: r.order(), Status: idempotency.OrderPaid}},
			"a refund again":    {r.refund("late", 300), idempotency.PaymentOutcome{Duplicate: true, Applied: true, OrderNo: r.order(), Status: idempotency.OrderPaid}},
			"a refund that waited, again": {r.refund("early", 200),
				idempotency.PaymentOutcome{Duplicate: true, Applied: true, OrderNo: r.order(), Status: idempotency.OrderPaid}},
		} {
			require.Equal(t, tc.want, b.apply(t, tc.ev), name)
			require.Equal(t, before, b.facts(t, r), name)
		}

		// Another success event of the same payment is recorded, and applies
		// nothing.
		require.Equal(t, idempotency.PaymentOutcome{OrderNo: r.order(), Status: idempotency.OrderPaid}, b.apply(t, again))
		p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
		require.NoError(t, err)
		require.Equal(t, int64(500), p.RefundedCents)
		require.Equal(t, 3, p.EventsApplied, "the success and two refunds")
	})

	// A refund whose payment never succeeds stays pending and moves nothing.
	t.Run("RefundOfAPaymentThatNeverSucceeds_StaysPending", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		out := b.apply(t, r.refund("a", 500))
		require.Equal(t, idempotency.PaymentOutcome{Pending: true}, out)
		p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
		require.NoError(t, err)
		require.Equal(t, &idempotency.Payment{Provider: "stripe", PaymentID: r.payment(), Status: idempotency.PaymentPending}, p)
		o, err := b.orders.Get(context.Background(), b.db, r.order())
		require.NoError(t, err)
		require.Equal(t, idempotency.OrderCreated, o.Status)
		require.Equal(t, []string{"stripe E-a REFUNDED P   500 CNY d-a PENDING "}, b.facts(t, r).Events)
	})

	// Money taken for an order that will not ship: the payment applies, the
	// order stays CANCELED, and the refund owed is reported and listed until
	// the refund arrives.
	t.Run("SuccessAfterCancel_KeepsItCanceledAndOwesTheRefund", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		require.Equal(t, idempotency.OrderCanceled, b.cancel(t, r))
		out := b.apply(t, r.success(1500))
		require.Equal(t, idempotency.PaymentOutcome{Applied: true, Anomaly: idempotency.AnomalyRefundOwed,
			OrderNo: r.order(), Status: idempotency.OrderCanceled}, out)
		requireEnd(t, b, r, idempotency.OrderCanceled, 0, 1500)

		out = b.apply(t, r.refund("a", 1500))
		require.Equal(t, idempotency.PaymentOutcome{Applied: true, OrderNo: r.order(), Status: idempotency.OrderRefunded}, out)
		requireEnd(t, b, r, idempotency.OrderRefunded, 1500, 0)
	})

	t.Run("CancelOfAnUnknownOrder_IsErrOrderNotFound", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		tx, err := b.db.BeginTx(context.Background(), b.engine.TxOptions)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck
		_, err = b.orders.RequestCancel(context.Background(), tx, "O-nowhere")
		require.ErrorIs(t, err, idempotency.ErrOrderNotFound)
	})

	t.Run("InvalidEvent_IsAnErrorAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		for name, mutate := range map[string]func(ev *idempotency.PaymentEvent){
			"no provider":  func(ev *idempotency.PaymentEvent) { ev.Provider = "" },
			"no event id":  func(ev *idempotency.PaymentEvent) { ev.EventID = "" },
			"zero amount":  func(ev *idempotency.PaymentEvent) { ev.Amount = 0 },
			"bad currency": func(ev *idempotency.PaymentEvent) { ev.Currency = "yuan" },
			"unknown kind": func(ev *idempotency.PaymentEvent) { ev.Kind = "CHARGEBACK" },
		} {
			ev := r.success(1500)
			mutate(&ev)
			tx, err := b.db.BeginTx(context.Background(), b.engine.TxOptions)
			require.NoError(t, err)
			_, err = b.orders.ApplyPayment(context.Background(), tx, ev)
			require.ErrorIs(t, err, idempotency.ErrInvalidPaymentEvent, name)
			require.NoError(t, tx.Rollback())
		}
		require.Empty(t, b.rows(t, `SELECT event_id FROM payment_event`))
	})

	// A provider that reports the payment's whole refunded amount so far
	// (PaymentRefundedTotal) never adds to the refunds applied: the payment
	// keeps the largest total, and totals delivered in any order, before or
	// after the success, end at the largest.
	t.Run("RefundedTotals_InAnyOrder_EndAtTheLargest", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		total := func(r run, id string, amount int64) idempotency.PaymentEvent {
			ev := r.refund(id, amount)
			ev.Kind = idempotency.PaymentRefundedTotal
			return ev
		}
		for i, tc := range []struct {
			name  string
			steps func(r run) []idempotency.PaymentEvent
		}{
			{"rising", func(r run) []idempotency.PaymentEvent {
				return []idempotency.PaymentEvent{r.success(1500), total(r, "a", 300), total(r, "b", 1000)}
			}},
			{"falling", func(r run) []idempotency.PaymentEvent {
				return []idempotency.PaymentEvent{r.success(1500), total(r, "b", 1000), total(r, "a", 300)}
			}},
			{"before the success", func(r run) []idempotency.PaymentEvent {
				return []idempotency.PaymentEvent{total(r, "b", 1000), total(r, "a", 300), r.success(1500)}
			}},
			{"mixed with a refund of its own", func(r run) []idempotency.PaymentEvent {
				return []idempotency.PaymentEvent{r.success(1500), r.refund("c", 200), total(r, "b", 1000), total(r, "a", 300)}
			}},
		} {
			r := run(fmt.Sprintf("-total%d", i))
			b.createOrder(t, r)
			for _, ev := range tc.steps(r) {
				b.apply(t, ev)
			}
			p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
			require.NoError(t, err, tc.name)
			require.Equal(t, int64(1000), p.RefundedCents, "%s: the largest total", tc.name)
			require.Equal(t, idempotency.OrderPaid, b.apply(t, r.success(1500)).Status, tc.name)
		}
	})
}
