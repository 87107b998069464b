package paymenttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// permutations returns every order of steps.
func permutations(steps []step) [][]step {
	if len(steps) <= 1 {
		return [][]step{steps}
	}
	var out [][]step
	for i := range steps {
		rest := append(append([]step{}, steps[:i]...), steps[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]step{steps[i]}, p...))
		}
	}
	return out
}

func names(steps []step) string {
	var n []string
	for _, s := range steps {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// deliveryOrderCases are event sets, each with the end every delivery order
// must reach: the order's status, its payment's refunded amount and the
// refund owed (0 for none).
var deliveryOrderCases = []struct {
	name     string
	steps    []step
	status   idempotency.OrderStatus
	refunded int64
	owed     int64
}{
	{"success, full refund, cancel", []step{stepSuccess, stepRefundAll, stepCancel}, idempotency.OrderRefunded, 1500, 0},
	{"success, two partial refunds that make the whole, cancel", []step{stepSuccess, stepRefund500, stepRefund1k, stepCancel}, idempotency.OrderRefunded, 1500, 0},
	{"success, partial refund, cancel", []step{stepSuccess, stepRefund500, stepCancel}, idempotency.OrderCanceled, 500, 1000},
	{"success, two partial refunds short of the whole", []step{stepSuccess, stepRefund500, stepRefund300}, idempotency.OrderPaid, 800, 0},
	{"success, cancel", []step{stepSuccess, stepCancel}, idempotency.OrderCanceled, 0, 1500},
	{"success, full refund", []step{stepSuccess, stepRefundAll}, idempotency.OrderRefunded, 1500, 0},
}

// race runs first in a transaction that holds its locks, then second in a
// transaction of its own, and commits first only once second has finished
// or waits for one of first's locks: second always runs against first's
// uncommitted effects. Second retries on ErrPaymentConflict in a new
// transaction, as a caller would. It reports whether second waited and how
// many conflicts it met.
func race(t *testing.T, b *bundle, r run, first, second step) (waited bool, conflicts int) {
	t.Helper()
	ctx := context.Background()
	db, o := b.db, b.orders
	txA, err := db.BeginTx(ctx, b.engine.TxOptions)
	require.NoError(t, err)
	defer txA.Rollback() //nolint:errcheck
	require.NoError(t, first.apply(ctx, txA, o, r))

	var current atomic.Int64 // the connection of second's latest attempt
	opened := make(chan struct{})
	done := make(chan error, 1)
	go func() { // no require in this goroutine
		var err error
		defer func() { done <- err }()
		for attempt := 0; ; attempt++ {
			var tx *sql.Tx
			if tx, err = db.BeginTx(ctx, b.engine.TxOptions); err != nil {
				return
			}
			// A read first, as the idempotency record's transaction does:
			// on MySQL it fixes the snapshot that plain reads see.
			var id, n int64
			if err = tx.QueryRowContext(ctx, b.engine.ConnectionID).Scan(&id); err == nil {
				err = tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM payment_event").Scan(&n)
			}
			if err != nil {
				_ = tx.Rollback()
				return
			}
			current.Store(id)
			if attempt == 0 {
				close(opened) // the barrier: second's transaction is open
			}
			err = second.apply(ctx, tx, o, r)
			if errors.Is(err, idempotency.ErrPaymentConflict) {
				conflicts++
				_ = tx.Rollback()
				continue
			}
			if err != nil {
				_ = tx.Rollback()
				return
			}
			err = tx.Commit()
			return
		}
	}()
	<-opened
	for {
		select {
		case err := <-done:
			require.NoError(t, err, "second, before first committed")
			require.NoError(t, txA.Commit())
			return false, conflicts
		default:
		}
		if b.lockWaits(t, current.Load()) > 0 {
			require.NoError(t, txA.Commit())
			require.NoError(t, <-done, "second, after first committed")
			return true, conflicts
		}
	}
}

// lockWaitGate spaces the suite's reads of the lock table at least
// LockWaitPoll apart across all its specifications at once: InnoDB
// refreshes information_schema.innodb_trx only when nobody read it for
// 0.1 s, so parallel specifications each polling it on its own could keep
// it stale for ever (a wait never seen, the waiter's lock wait timing out
// after 50 s: seen when the suite ran at two isolation levels at once).
var lockWaitGate struct {
	sync.Mutex
	last time.Time
}

// lockWaits counts the lock waits of connection conn, by a fresh read of
// the engine's lock table.
func (b *bundle) lockWaits(t *testing.T, conn int64) int {
	t.Helper()
	lockWaitGate.Lock()
	defer lockWaitGate.Unlock()
	if d := b.engine.LockWaitPoll - time.Since(lockWaitGate.last); d > 0 {
		time.Sleep(d) // a poll of the lock table, not a wait for an interleaving
	}
	var n int
	err := b.db.QueryRow(b.engine.LockWaits, conn).Scan(&n)
	lockWaitGate.last = time.Now()
	require.NoError(t, err)
	return n
}

// exerciseDeliveryOrders runs the specifications of the order in which a
// payment's events arrive: one after the other in any order, and two at
// once.
func exerciseDeliveryOrders(t *testing.T, e Engine) {
	t.Run("EveryDeliveryOrder_EndsInTheSameStateAndFacts", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		ctx := context.Background()
		n := 0
		for _, tc := range deliveryOrderCases {
			t.Run(tc.name, func(t *testing.T) {
				var first *recordedFacts
				for _, perm := range permutations(tc.steps) {
					n++
					r := run(fmt.Sprintf("-r%d", n))
					b.createOrder(t, r)
					for _, s := range perm {
						b.inTx(t, func(tx *sql.Tx) error { return s.apply(ctx, tx, b.orders, r) })
					}
					got := b.facts(t, r)
					if first == nil {
						first = &got
						requireEnd(t, b, r, tc.status, tc.refunded, tc.owed)
						continue
					}
					require.Equal(t, *first, got, "delivered in the order %s", names(perm))
				}
			})
		}
	})

	// Each pair of {success, full refund, cancel} at once, the third before
	// or after: the same end as one after the other.
	t.Run("EachPairAtOnce_EndsInTheSameStateAndFacts", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		ctx := context.Background()
		ref := run("-ref")
		b.createOrder(t, ref)
		for _, s := range []step{stepSuccess, stepRefundAll, stepCancel} {
			b.inTx(t, func(tx *sql.Tx) error { return s.apply(ctx, tx, b.orders, ref) })
		}
		requireEnd(t, b, ref, idempotency.OrderRefunded, 1500, 0)
		want := b.facts(t, ref)

		all := []step{stepSuccess, stepRefundAll, stepCancel}
		n := 0
		for i, first := range all {
			for j, second := range all {
				if i == j {
					continue
				}
				third := all[3-i-j]
				for _, thirdFirst := range []bool{true, false} {
					n++
					r := run(fmt.Sprintf("-c%d", n))
					name := fmt.Sprintf("%s holding its locks, %s at once, %s after", first.name, second.name, third.name)
					if thirdFirst {
						name = fmt.Sprintf("%s, then %s holding its locks, %s at once", third.name, first.name, second.name)
					}
					t.Run(name, func(t *testing.T) {
						b.createOrder(t, r)
						if thirdFirst {
							b.inTx(t, func(tx *sql.Tx) error { return third.apply(ctx, tx, b.orders, r) })
						}
						waited, conflicts := race(t, b, r, first, second)
						if !thirdFirst {
							b.inTx(t, func(tx *sql.Tx) error { return third.apply(ctx, tx, b.orders, r) })
						}
						t.Logf("second waited for first's locks: %v; conflicts retried: %d", waited, conflicts)
						if first.name == "success" && second.name == "cancel" || first.name == "cancel" && second.name == "success" {
							require.True(t, waited, "a success and a cancel lock the same order row")
						}
						require.Equal(t, want, b.facts(t, r))
					})
				}
			}
		}
	})

	// A refund that finds its payment pending keeps it pending; when the
	// success it read as absent commits under it, it does not reach for the
	// order's lock (that would invert the lock order) but fails with
	// ErrPaymentConflict, and its retry applies it.
	t.Run("RefundMeetingItsSuccessCommitting_IsAConflictItsRetryApplies", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, e)
		r := run("-1")
		b.createOrder(t, r)
		waited, conflicts := race(t, b, r, stepSuccess, stepRefundAll)
		require.True(t, waited, "the refund waits for the success's payment row")
		require.Equal(t, 1, conflicts)
		requireEnd(t, b, r, idempotency.OrderRefunded, 1500, 0)
	})
}
