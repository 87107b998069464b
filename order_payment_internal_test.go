package idempotency

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The order's status is a function of its facts (order_payment.go): the
// table is the whole rule, and every derived move is a transition of the
// state machine.
func TestOrderFacts_Status_IsDerivedFromPaidRefundedAndCancel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    orderFacts
		want OrderStatus
		owed int64
	}{
		{"not paid", orderFacts{}, OrderCreated, 0},
		{"not paid, cancel requested", orderFacts{cancel: true}, OrderCanceled, 0},
		{"paid", orderFacts{paid: true, amount: 1500}, OrderPaid, 0},
		{"paid, partly refunded", orderFacts{paid: true, amount: 1500, refunded: 500}, OrderPaid, 0},
		{"paid, refunded in full", orderFacts{paid: true, amount: 1500, refunded: 1500}, OrderRefunded, 0},
		{"paid, cancel requested: a refund is owed", orderFacts{paid: true, amount: 1500, cancel: true}, OrderCanceled, 1500},
		{"paid, partly refunded, cancel requested", orderFacts{paid: true, amount: 1500, refunded: 500, cancel: true}, OrderCanceled, 1000},
		{"paid, refunded in full, cancel requested", orderFacts{paid: true, amount: 1500, refunded: 1500, cancel: true}, OrderRefunded, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.f.status())
			require.Equal(t, tc.owed, tc.f.refundOwed())
		})
	}
}

// Facts only grow, so from any derived state, adding a fact derives the
// same state or one the state machine allows moving to.
func TestOrderFacts_AddingAFact_IsAlwaysATransitionOfTheStateMachine(t *testing.T) {
	t.Parallel()
	var all []orderFacts
	for _, paid := range []bool{false, true} {
		for _, refunded := range []int64{0, 500, 1500} {
			for _, cancel := range []bool{false, true} {
				if !paid && refunded > 0 {
					continue
				}
				all = append(all, orderFacts{paid: paid, amount: 1500, refunded: refunded, cancel: cancel})
			}
		}
	}
	grows := func(a, b orderFacts) bool {
		return (!a.paid || b.paid) && a.refunded <= b.refunded && (!a.cancel || b.cancel)
	}
	for _, a := range all {
		for _, b := range all {
			if !grows(a, b) || a.status() == b.status() {
				continue
			}
			require.True(t, CanTransition(a.status(), b.status()), "%+v → %+v: %s → %s", a, b, a.status(), b.status())
		}
	}
	require.False(t, CanTransition(OrderRefunded, OrderPaid), "REFUNDED is final")
	require.False(t, CanTransition(OrderCanceled, OrderPaid), "a cancel request is never withdrawn")
}

func TestErrPaymentConflict_IsTransient(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, ErrPaymentConflict, ErrTransient)
	require.True(t, IsTransient(ErrPaymentConflict))
}
