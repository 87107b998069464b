package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The payment state machine (the root package's order_payment.go) on
// PostgreSQL through PostgresOrders: the specifications of the root
// package's order_payment_test.go, which runs them on MariaDB.
//
// "Same recorded facts" is what facts() reads: the order row (status,
// cancel_requested, currency, total), the payment row (every column but the
// times), the event rows and the anomaly rows (every column but ids and
// times), and ListAnomalies without its times. Each run of a permutation
// gets ids of its own (a "-r<n>" suffix), which facts() strips.

// paymentBundle is one migrated database and the SQL to inspect it.
type paymentBundle struct {
	db     *sql.DB
	orders idempotency.Orders
}

func newPaymentBundle(t *testing.T) *paymentBundle {
	t.Helper()
	return &paymentBundle{db: newPostgres(t), orders: idempotency.PostgresOrders}
}

// run is one run's ids: the order O, its payment P, events E-*.
type run string

func (r run) order() string          { return "O" + string(r) }
func (r run) payment() string        { return "P" + string(r) }
func (r run) event(id string) string { return "E-" + id + string(r) }

func (r run) success(amount int64) idempotency.PaymentEvent {
	return idempotency.PaymentEvent{Provider: "stripe", EventID: r.event("s"), PaymentID: r.payment(), OrderNo: r.order(),
		Kind: idempotency.PaymentSucceeded, Amount: amount, Currency: "cny", Digest: "d-s"}
}

func (r run) refund(id string, amount int64) idempotency.PaymentEvent {
	return idempotency.PaymentEvent{Provider: "stripe", EventID: r.event(id), PaymentID: r.payment(),
		Kind: idempotency.PaymentRefunded, Amount: amount, Currency: "CNY", Digest: "d-" + id}
}

// step is one delivery: a provider event or the user's cancel.
type step struct {
	name  string
	apply func(ctx context.Context, tx *sql.Tx, o idempotency.Orders, r run) error
}

func eventStep(name string, ev func(r run) idempotency.PaymentEvent) step {
	return step{name: name, apply: func(ctx context.Context, tx *sql.Tx, o idempotency.Orders, r run) error {
		_, err := o.ApplyPayment(ctx, tx, ev(r))
		return err
	}}
}

var (
	stepSuccess   = eventStep("success", func(r run) idempotency.PaymentEvent { return r.success(1500) })
	stepRefundAll = eventStep("refund 1500", func(r run) idempotency.PaymentEvent { return r.refund("r-all", 1500) })
	stepRefund500 = eventStep("refund 500", func(r run) idempotency.PaymentEvent { return r.refund("r-500", 500) })
	stepRefund300 = eventStep("refund 300", func(r run) idempotency.PaymentEvent { return r.refund("r-300", 300) })
	stepRefund1k  = eventStep("refund 1000", func(r run) idempotency.PaymentEvent { return r.refund("r-1000", 1000) })
	stepCancel    = step{name: "cancel", apply: func(ctx context.Context, tx *sql.Tx, o idempotency.Orders, r run) error {
		_, err := o.RequestCancel(ctx, tx, r.order())
		return err
	}}
)

// createOrder creates r's order: 1500 CNY.
func (b *paymentBundle) createOrder(t *testing.T, r run) {
	t.Helper()
	o := newOrder(r.order(), "k"+string(r))
	o.Currency = "CNY"
	b.inTx(t, func(tx *sql.Tx) error { return b.orders.Create(context.Background(), tx, o) })
}

func (b *paymentBundle) inTx(t *testing.T, f func(tx *sql.Tx) error) {
	t.Helper()
	tx, err := b.db.Begin()
	require.NoError(t, err)
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
}

func (b *paymentBundle) apply(t *testing.T, ev idempotency.PaymentEvent) idempotency.PaymentOutcome {
	t.Helper()
	var out idempotency.PaymentOutcome
	b.inTx(t, func(tx *sql.Tx) (err error) {
		out, err = b.orders.ApplyPayment(context.Background(), tx, ev)
		return err
	})
	return out
}

func (b *paymentBundle) cancel(t *testing.T, r run) idempotency.OrderStatus {
	t.Helper()
	var st idempotency.OrderStatus
	b.inTx(t, func(tx *sql.Tx) (err error) {
		st, err = b.orders.RequestCancel(context.Background(), tx, r.order())
		return err
	})
	return st
}

// rows reads a query's rows as text, one line per row.
func (b *paymentBundle) rows(t *testing.T, query string, args ...any) []string {
	t.Helper()
	rows, err := b.db.Query(query, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		fields := make([]string, len(vals))
		for i, v := range vals {
			if raw, ok := v.([]byte); ok {
				v = string(raw)
			}
			fields[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(fields, " "))
	}
	require.NoError(t, rows.Err())
	return out
}

// recordedFacts is everything the payment path records about one run.
type recordedFacts struct {
	Order, Payment, Events, Anomalies []string
	Listed                            []idempotency.PaymentAnomaly
}

func (b *paymentBundle) facts(t *testing.T, r run) recordedFacts {
	t.Helper()
	f := recordedFacts{
		Order: b.rows(t, `SELECT status, cancel_requested, currency, total_cents FROM purchase_order WHERE order_no = $1`, r.order()),
		Payment: b.rows(t, `SELECT provider, payment_id, COALESCE(order_no, ''), status, COALESCE(amount_cents, 0),
  COALESCE(currency, ''), refunded_cents, events_applied FROM order_payment WHERE payment_id = $1`, r.payment()),
		Events: b.rows(t, `SELECT provider, event_id, kind, payment_id, COALESCE(order_no, ''), amount_cents, currency, digest,
  outcome, COALESCE(reason, '') FROM payment_event WHERE payment_id = $1 ORDER BY event_id`, r.payment()),
		Anomalies: b.rows(t, `SELECT provider, event_id, kind, payment_id, COALESCE(order_no, ''), amount_cents, currency, digest,
  reason FROM payment_anomaly WHERE payment_id = $1 ORDER BY event_id, reason`, r.payment()),
	}
	listed, err := b.orders.ListAnomalies(context.Background(), b.db, 1000)
	require.NoError(t, err)
	for _, a := range listed {
		if a.PaymentID == r.payment() {
			a.At = time.Time{}
			a.EventID = strings.TrimSuffix(a.EventID, string(r))
			a.PaymentID = strings.TrimSuffix(a.PaymentID, string(r))
			a.OrderNo = strings.TrimSuffix(a.OrderNo, string(r))
			f.Listed = append(f.Listed, a)
		}
	}
	strip := func(lines []string) {
		for i := range lines {
			lines[i] = strings.ReplaceAll(lines[i], string(r), "")
		}
	}
	strip(f.Order)
	strip(f.Payment)
	strip(f.Events)
	strip(f.Anomalies)
	return f
}

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

func TestPayment_Postgres_EveryDeliveryOrder_EndsInTheSameStateAndFacts(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}

// requireEnd checks the end a case must reach, so that the permutations
// cannot all agree on a wrong one.
func requireEnd(t *testing.T, b *paymentBundle, r run, status idempotency.OrderStatus, refunded, owed int64) {
	t.Helper()
	o, err := b.orders.Get(context.Background(), b.db, r.order())
	require.NoError(t, err)
	require.Equal(t, status, o.Status)
	p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
	require.NoError(t, err)
	require.Equal(t, idempotency.PaymentSettled, p.Status)
	require.Equal(t, refunded, p.RefundedCents)
	require.Equal(t, r.order(), p.OrderNo)
	require.Equal(t, int64(1500), p.AmountCents)
	list, err := b.orders.ListAnomalies(context.Background(), b.db, 1000)
	require.NoError(t, err)
	var gotOwed int64
	for _, a := range list {
		if a.PaymentID == r.payment() {
			require.Equal(t, idempotency.AnomalyRefundOwed, a.Reason, "%+v", a)
			require.Equal(t, r.event("s"), a.EventID, "the payment's success")
			gotOwed += a.AmountCents
		}
	}
	require.Equal(t, owed, gotOwed, "refund owed")
}

// pgLockWait counts the lock waits of one backend; pg_stat_activity is
// live, so it may be polled often (pgPoll).
const (
	pgLockWait = `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`
	pgPoll     = time.Millisecond
)

// race runs first in a transaction that holds its locks, then second in a
// transaction of its own, and commits first only once second has finished
// or waits for one of first's locks: second always runs against first's
// uncommitted effects. Second retries on ErrPaymentConflict in a new
// transaction, as a caller would. It reports whether second waited and how
// many conflicts it met.
func race(t *testing.T, db *sql.DB, o idempotency.Orders, r run, first, second step, connID, lockWait string, poll time.Duration) (waited bool, conflicts int) {
	t.Helper()
	ctx := context.Background()
	txA, err := db.BeginTx(ctx, nil)
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
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				return
			}
			// A read first, as the idempotency record's transaction does
			// (on MySQL it fixes the snapshot that plain reads see).
			var id, n int64
			if err = tx.QueryRowContext(ctx, connID).Scan(&id); err == nil {
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
		var n int
		require.NoError(t, db.QueryRow(lockWait, current.Load()).Scan(&n))
		if n > 0 {
			require.NoError(t, txA.Commit())
			require.NoError(t, <-done, "second, after first committed")
			return true, conflicts
		}
		time.Sleep(poll) // a poll of the lock table, not a wait for an interleaving
	}
}

// Each pair of {success, full refund, cancel} at once, the third before or
// after: the same end as one after the other.
func TestPayment_Postgres_EachPairAtOnce_EndsInTheSameStateAndFacts(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
					waited, conflicts := race(t, b.db, b.orders, r, first, second, "SELECT pg_backend_pid()", pgLockWait, pgPoll)
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
}

// A refund that finds its payment pending keeps it pending; when the
// success it read as absent commits under it, it does not reach for the
// order's lock (that would invert the lock order) but fails with
// ErrPaymentConflict, and its retry applies it.
func TestPayment_Postgres_RefundMeetingItsSuccessCommitting_IsAConflictItsRetryApplies(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
	r := run("-1")
	b.createOrder(t, r)
	waited, conflicts := race(t, b.db, b.orders, r, stepSuccess, stepRefundAll, "SELECT pg_backend_pid()", pgLockWait, pgPoll)
	require.True(t, waited, "the refund waits for the success's payment row")
	require.Equal(t, 1, conflicts)
	requireEnd(t, b, r, idempotency.OrderRefunded, 1500, 0)
}

func TestPayment_Postgres_SuccessWithTheOrdersAmountAndCurrency_PaysIt(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
	r := run("-1")
	b.createOrder(t, r)
	out := b.apply(t, r.success(1500))
	require.Equal(t, idempotency.PaymentOutcome{Applied: true, OrderNo: r.order(), Status: idempotency.OrderPaid}, out)
	p, err := b.orders.GetPayment(context.Background(), b.db, "stripe", r.payment())
	require.NoError(t, err)
	require.Equal(t, &idempotency.Payment{Provider: "stripe", PaymentID: r.payment(), OrderNo: r.order(),
		Status: idempotency.PaymentSettled, AmountCents: 1500, Currency: "CNY", EventsApplied: 1}, p)
}

func TestPayment_Postgres_PartialRefunds_AccumulateAndKeepPaidUntilWhole(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}

// A PAID order's further success events, and any event delivered twice,
// change nothing.
func TestPayment_Postgres_DuplicateEvents_AreNoOps(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}

// A refund whose payment never succeeds stays pending and moves nothing.
func TestPayment_Postgres_RefundOfAPaymentThatNeverSucceeds_StaysPending(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
	require.Equal(t, []string{"stripe E-a REFUNDED P  500 CNY d-a PENDING "}, b.facts(t, r).Events)
}

// Every verified event that cannot apply is recorded with its reason,
// answered as an outcome (not an error), listed, and changes no fact.
func TestPayment_Postgres_EventsThatCannotApply_AreRecordedListedAndChangeNothing(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}

// Money taken for an order that will not ship: the payment applies, the
// order stays CANCELED, and the refund owed is reported and listed until
// the refund arrives.
func TestPayment_Postgres_SuccessAfterCancel_KeepsItCanceledAndOwesTheRefund(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}

func TestPayment_Postgres_CancelOfAnUnknownOrder_IsErrOrderNotFound(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
	tx, err := b.db.Begin()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	_, err = b.orders.RequestCancel(context.Background(), tx, "O-nowhere")
	require.ErrorIs(t, err, idempotency.ErrOrderNotFound)
}

func TestPayment_Postgres_InvalidEvent_IsAnErrorAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
		tx, err := b.db.Begin()
		require.NoError(t, err)
		_, err = b.orders.ApplyPayment(context.Background(), tx, ev)
		require.ErrorIs(t, err, idempotency.ErrInvalidPaymentEvent, name)
		require.NoError(t, tx.Rollback())
	}
	require.Empty(t, b.rows(t, `SELECT event_id FROM payment_event`))
}

// A provider that reports the payment's whole refunded amount so far
// (PaymentRefundedTotal) adds only what it reports beyond the refunds
// applied: totals delivered in any order, before or after the success, end
// at the largest.
func TestPayment_Postgres_RefundedTotals_InAnyOrder_EndAtTheLargest(t *testing.T) {
	t.Parallel()
	b := newPaymentBundle(t)
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
}
