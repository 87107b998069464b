package paymenttest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Steps of one provider telling of its refunds several times, as Stripe
// does: refund.created, refund.updated and charge.refund.updated for one
// refund (one RefundID, three event ids), and charge.refunded with the
// payment's whole refunded amount so far (a total, no RefundID).
var (
	stepRefundCreated500 = eventStep("refund.created re-a 500", func(r run) idempotency.PaymentEvent { return r.refundOf("created", "a", 500) })
	stepRefundUpdated500 = eventStep("refund.updated re-a 500", func(r run) idempotency.PaymentEvent { return r.refundOf("updated", "a", 500) })
	stepChargeRefundUpd  = eventStep("charge.refund.updated re-a 500", func(r run) idempotency.PaymentEvent {
		return r.refundOf("charge-updated", "a", 500)
	})
	stepRefundCreated750 = eventStep("refund.created re-h 750", func(r run) idempotency.PaymentEvent { return r.refundOf("created", "h", 750) })
	stepRefundUpdated750 = eventStep("refund.updated re-h 750", func(r run) idempotency.PaymentEvent { return r.refundOf("updated", "h", 750) })
	stepRefundCreated300 = eventStep("refund.created re-b 300", func(r run) idempotency.PaymentEvent { return r.refundOf("created-b", "b", 300) })
	stepRefundCreatedC5  = eventStep("refund.created re-c 500", func(r run) idempotency.PaymentEvent { return r.refundOf("created-c", "c", 500) })
	stepTotal300         = eventStep("charge.refunded total 300", func(r run) idempotency.PaymentEvent { return r.total("total-300", 300) })
	stepTotal800         = eventStep("charge.refunded total 800", func(r run) idempotency.PaymentEvent { return r.total("total-800", 800) })
	stepTotal2000        = eventStep("charge.refunded total 2000", func(r run) idempotency.PaymentEvent { return r.total("total-2000", 2000) })
)

// exerciseRefundIdentity runs the specifications of refunds told more than
// once: by several events of one refund (one RefundID), and by reported
// totals beside the refunds they count. One refund applies once, and the
// refunded amount is the larger of the distinct refunds' sum and the
// largest total reported, in every delivery order, the success first or
// last (the refunds then wait for it and apply when it settles).
func exerciseRefundIdentity(t *testing.T, e Engine) {
	t.Run("OneRefundToldInSeveralEvents_AppliesOnceInEveryDeliveryOrder", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		for i, tc := range []struct {
			name     string
			steps    []step
			status   idempotency.OrderStatus
			refunded int64
		}{
			{"refund.created and refund.updated of one refund of half the payment",
				[]step{stepSuccess, stepRefundCreated750, stepRefundUpdated750}, idempotency.OrderPaid, 750},
			{"refund.created, refund.updated and charge.refund.updated of one refund",
				[]step{stepSuccess, stepRefundCreated500, stepRefundUpdated500, stepChargeRefundUpd}, idempotency.OrderPaid, 500},
			{"two events of one refund beside another refund",
				[]step{stepSuccess, stepRefundCreated500, stepRefundUpdated500, stepRefundCreated300}, idempotency.OrderPaid, 800},
		} {
			t.Run(tc.name, func(t *testing.T) {
				everyDeliveryOrder(t, b, fmt.Sprint("c", i), tc.steps, func(t *testing.T, r run, first, got recordedFacts) {
					requireEnd(t, b, r, tc.status, tc.refunded, 0)
					// Which event of the refund applied is the first to
					// arrive; the others are recorded and change nothing.
					applied := map[string]int{}
					for _, ev := range b.rows(t, `SELECT refund_id, outcome FROM payment_event
WHERE payment_id = ? AND kind = 'REFUNDED'`, r.payment()) {
						refundID, outcome, _ := strings.Cut(ev, " ")
						require.Contains(t, []string{"APPLIED", "NOOP"}, outcome, ev)
						if outcome == "APPLIED" {
							applied[refundID]++
						}
					}
					for refundID, n := range applied {
						require.Equal(t, 1, n, "events applied of refund %s", refundID)
					}
					require.Equal(t, first.Order, got.Order)
					require.Equal(t, first.Payment, got.Payment)
					require.Equal(t, first.Anomalies, got.Anomalies)
					require.Equal(t, first.Listed, got.Listed)
				})
			})
		}
	})

	t.Run("RefundsAndReportedTotals_DoNotAddUpInEveryDeliveryOrder", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		for i, tc := range []struct {
			name     string
			steps    []step
			status   idempotency.OrderStatus
			refunded int64
		}{
			{"charge.refunded total 300 and refund.created of that 300",
				[]step{stepSuccess, stepTotal300, stepRefundCreated300}, idempotency.OrderPaid, 300},
			{"two distinct refunds and a total equal to their sum",
				[]step{stepSuccess, stepRefundCreated300, stepRefundCreatedC5, stepTotal800}, idempotency.OrderPaid, 800},
			{"a total below the distinct refunds' sum",
				[]step{stepSuccess, stepRefundCreated300, stepRefundCreatedC5, stepTotal300}, idempotency.OrderPaid, 800},
		} {
			t.Run(tc.name, func(t *testing.T) {
				everyDeliveryOrder(t, b, fmt.Sprint("c", i), tc.steps, func(t *testing.T, r run, first, got recordedFacts) {
					requireEnd(t, b, r, tc.status, tc.refunded, 0)
					require.Equal(t, first, got)
				})
			})
		}
	})

	// A reported total above the payment is an anomaly recorded with the
	// amount the provider reported, whether it arrived after the success or
	// waited for it behind a refund.
	t.Run("ReportedTotalAboveThePayment_IsAnAnomalyOfTheReportedAmountInEveryDeliveryOrder", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		steps := []step{stepSuccess, stepRefundCreated500, stepTotal2000}
		everyDeliveryOrder(t, b, "x", steps, func(t *testing.T, r run, first, got recordedFacts) {
			o, err := b.orders.Get(context.Background(), b.db, r.order())
			require.NoError(t, err)
			require.Equal(t, idempotency.OrderPaid, o.Status)
			p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
			require.NoError(t, err)
			require.Equal(t, int64(500), p.RefundedCents)
			require.Equal(t, []string{"stripe E-total-2000 REFUNDED_TOTAL P O 2000 CNY d-total-2000 refund-exceeds-payment"},
				got.Anomalies)
			require.Equal(t, first, got)
		})
	})

	// The outcomes, one event at a time: the refund's second event is
	// recorded and changes nothing, whether its payment is settled or the
	// refund still waits for it.
	t.Run("SecondEventOfOneRefund_IsANoOp", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		ctx := context.Background()

		settled := run("-settled")
		b.createOrder(t, settled)
		b.apply(t, settled.success(1500))
		require.Equal(t, idempotency.PaymentOutcome{Applied: true, OrderNo: settled.order(), Status: idempotency.OrderPaid},
			b.apply(t, settled.refundOf("created", "a", 750)))
		require.Equal(t, idempotency.PaymentOutcome{OrderNo: settled.order(), Status: idempotency.OrderPaid},
			b.apply(t, settled.refundOf("updated", "a", 750)))
		p, err := b.orders.GetPayment(ctx, b.db, "stripe", settled.payment())
		require.NoError(t, err)
		require.Equal(t, int64(750), p.RefundedCents)
		require.Equal(t, 2, p.EventsApplied, "the success and the refund, once")

		pending := run("-pending")
		b.createOrder(t, pending)
		require.Equal(t, idempotency.PaymentOutcome{Pending: true}, b.apply(t, pending.refundOf("created", "a", 750)))
		require.Equal(t, idempotency.PaymentOutcome{}, b.apply(t, pending.refundOf("updated", "a", 750)),
			"the refund already waits")
		require.Equal(t, idempotency.PaymentOutcome{Applied: true, OrderNo: pending.order(), Status: idempotency.OrderPaid},
			b.apply(t, pending.success(1500)))
		p, err = b.orders.GetPayment(ctx, b.db, "stripe", pending.payment())
		require.NoError(t, err)
		require.Equal(t, int64(750), p.RefundedCents)
		require.Equal(t, 2, p.EventsApplied, "the success and the refund, once")

		// Redelivered, each event answers as it did.
		require.Equal(t, idempotency.PaymentOutcome{Duplicate: true, OrderNo: settled.order(), Status: idempotency.OrderPaid},
			b.apply(t, settled.refundOf("updated", "a", 750)))
		require.Equal(t, idempotency.PaymentOutcome{Duplicate: true, Applied: true, OrderNo: pending.order(), Status: idempotency.OrderPaid},
			b.apply(t, pending.refundOf("created", "a", 750)))
	})
}

// everyDeliveryOrder delivers steps to a run of their own in each order, one
// after the other, and calls check with the first order's facts and this
// order's.
// Runs are named prefix-<n>: each call on one bundle needs a prefix of its
// own.
func everyDeliveryOrder(t *testing.T, b *bundle, prefix string, steps []step, check func(t *testing.T, r run, first, got recordedFacts)) {
	t.Helper()
	ctx := context.Background()
	var first *recordedFacts
	for i, perm := range permutations(steps) {
		r := run(fmt.Sprintf("-%s-%d", prefix, i))
		b.createOrder(t, r)
		for _, s := range perm {
			b.inTx(t, func(tx *sql.Tx) error { return s.apply(ctx, tx, b.orders, r) })
		}
		got := b.facts(t, r)
		if first == nil {
			first = &got
		}
		t.Run(names(perm), func(t *testing.T) { check(t, r, *first, got) })
	}
}
