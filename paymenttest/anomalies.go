package paymenttest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// exerciseAnomalies runs the specification of verified events that cannot
// apply.
func exerciseAnomalies(t *testing.T, e Engine) {
	// Every verified event that cannot apply is recorded with its reason,
	// answered as an outcome (not an error), listed, and changes no fact.
	t.Run("EventsThatCannotApply_AreRecordedListedAndChangeNothing", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		n := 0
		for _, tc := range []struct {
			name   string
			before func(t *testing.T, r run)
			ev     func(r run) idempotency.PaymentEvent
			reason idempotency.AnomalyReason
			status idempotency.OrderStatus // the order's state after
			// refunded is the payment's refunded amount after, -1 when no
			// payment row exists.
			refunded int64
		}{
			{
				name: "unknown order",
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.success(1500)
					ev.OrderNo = "O-nowhere" + string(r)
					return ev
				},
				reason: idempotency.AnomalyUnknownOrder, status: idempotency.OrderCreated, refunded: -1,
			},
			{
				name: "a success that names no order",
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.success(1500)
					ev.OrderNo = ""
					return ev
				},
				reason: idempotency.AnomalyUnknownOrder, status: idempotency.OrderCreated, refunded: -1,
			},
			{
				name:   "amount other than the order's",
				ev:     func(r run) idempotency.PaymentEvent { return r.success(1499) },
				reason: idempotency.AnomalyAmountMismatch, status: idempotency.OrderCreated, refunded: -1,
			},
			{
				name: "currency other than the order's",
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.success(1500)
					ev.Currency = "USD"
					return ev
				},
				reason: idempotency.AnomalyCurrencyMismatch, status: idempotency.OrderCreated, refunded: -1,
			},
			{
				name:   "refund above the amount paid",
				before: func(t *testing.T, r run) { b.apply(t, r.success(1500)); b.apply(t, r.refund("a", 1000)) },
				ev:     func(r run) idempotency.PaymentEvent { return r.refund("b", 501) },
				reason: idempotency.AnomalyRefundExceedsPayment, status: idempotency.OrderPaid, refunded: 1000,
			},
			{
				name:   "refund of a payment refunded in full",
				before: func(t *testing.T, r run) { b.apply(t, r.success(1500)); b.apply(t, r.refund("a", 1500)) },
				ev:     func(r run) idempotency.PaymentEvent { return r.refund("b", 1) },
				reason: idempotency.AnomalyRefundExceedsPayment, status: idempotency.OrderRefunded, refunded: 1500,
			},
			{
				name: "refund in another currency than the payment's",
				before: func(t *testing.T, r run) {
					b.apply(t, r.success(1500))
				},
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.refund("a", 100)
					ev.Currency = "EUR"
					return ev
				},
				reason: idempotency.AnomalyCurrencyMismatch, status: idempotency.OrderPaid, refunded: 0,
			},
			{
				name: "refund naming another order than its payment's",
				before: func(t *testing.T, r run) {
					b.apply(t, r.success(1500))
				},
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.refund("a", 100)
					ev.OrderNo = "O-other"
					return ev
				},
				reason: idempotency.AnomalyOrderMismatch, status: idempotency.OrderPaid, refunded: 0,
			},
			{
				name:   "same event id, another payload",
				before: func(t *testing.T, r run) { b.apply(t, r.success(1500)) },
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.success(1500)
					ev.Digest = "d-forged"
					return ev
				},
				reason: idempotency.AnomalyPayloadMismatch, status: idempotency.OrderPaid, refunded: 0,
			},
			{
				name:   "a second payment of a paid order",
				before: func(t *testing.T, r run) { b.apply(t, r.success(1500)) },
				ev: func(r run) idempotency.PaymentEvent {
					ev := r.success(1500)
					ev.EventID, ev.PaymentID = r.event("s2"), r.payment()+"-2"
					return ev
				},
				reason: idempotency.AnomalyDoublePayment, status: idempotency.OrderPaid, refunded: 0,
			},
			{
				name: "refunds that waited for the success exceed it: the one that crosses the amount",
				before: func(t *testing.T, r run) {
					b.apply(t, r.refund("a", 1000))
					b.apply(t, r.refund("b", 1000))
				},
				ev:     func(r run) idempotency.PaymentEvent { return r.success(1500) },
				reason: idempotency.AnomalyRefundExceedsPayment, status: idempotency.OrderPaid, refunded: 1000,
			},
		} {
			n++
			r := run(fmt.Sprintf("-a%d", n))
			t.Run(tc.name, func(t *testing.T) {
				b.createOrder(t, r)
				if tc.before != nil {
					tc.before(t, r)
				}
				before := b.facts(t, r)
				ev := tc.ev(r)
				out := b.apply(t, ev)

				list, err := b.orders.ListAnomalies(context.Background(), b.db, 1000)
				require.NoError(t, err)
				var mine []idempotency.PaymentAnomaly
				for _, a := range list {
					if strings.HasSuffix(a.EventID, string(r)) {
						mine = append(mine, a)
					}
				}
				require.Len(t, mine, 1, "%+v", list)
				a := mine[0]
				require.Equal(t, tc.reason, a.Reason)
				require.False(t, a.At.IsZero())
				if tc.reason == idempotency.AnomalyRefundExceedsPayment && ev.Kind == idempotency.PaymentSucceeded {
					// The success applied; the second refund that waited
					// for it is the anomaly.
					require.True(t, out.Applied)
					require.Equal(t, r.event("b"), a.EventID)
					require.Equal(t, r.order(), a.OrderNo, "the payment's order, which the refund did not name")
				} else {
					require.Equal(t, tc.reason, out.Anomaly)
					require.False(t, out.Applied)
					require.Equal(t, ev.EventID, a.EventID)
					require.Equal(t, ev.PaymentID, a.PaymentID)
					require.Equal(t, ev.Amount, a.AmountCents)
					require.Equal(t, ev.Digest, a.Digest)
					require.Equal(t, before.Order, b.facts(t, r).Order, "no fact of the order changed")
					require.Equal(t, before.Payment, b.facts(t, r).Payment, "no fact of the payment changed")
				}

				o, err := b.orders.Get(context.Background(), b.db, r.order())
				require.NoError(t, err)
				require.Equal(t, tc.status, o.Status)
				p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
				if tc.refunded < 0 {
					require.ErrorIs(t, err, idempotency.ErrPaymentNotFound)
				} else {
					require.NoError(t, err)
					require.Equal(t, tc.refunded, p.RefundedCents)
				}

				// Delivered again, it is the same anomaly, recorded once.
				again := b.apply(t, ev)
				require.True(t, again.Duplicate)
				list, err = b.orders.ListAnomalies(context.Background(), b.db, 1000)
				require.NoError(t, err)
				count := 0
				for _, a := range list {
					if strings.HasSuffix(a.EventID, string(r)) {
						count++
					}
				}
				require.Equal(t, 1, count)
			})
		}
	})
}
