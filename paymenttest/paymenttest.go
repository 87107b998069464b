// Package paymenttest is the conformance suite of the payment state machine
// (the root package's order_payment.go) that every dialect's Orders must
// pass, as storetest is for stores: every delivery order of a payment's
// events ends in the same state and facts, each pair of them at once does
// too, anomalies are recorded and listed and change nothing, duplicates are
// no-ops, refunds add up, and one refund told by several events, or by a
// refunded total beside its own event, counts once. The root package runs it
// on MariaDB/MySQL with MySQLOrders, the postgres module on PostgreSQL with
// PostgresOrders.
//
// "Same recorded facts" is what facts() reads: the order row (status,
// cancel_requested, currency, total), the payment row (every column but the
// times), the event rows and the anomaly rows (every column but ids and
// times), and ListAnomalies without its times. Each run of a permutation
// gets ids of its own (a "-r<n>" suffix), which facts() strips.
package paymenttest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Engine is a database the payment state machine runs on, with what the
// suite needs to know of its dialect.
type Engine struct {
	// Open returns a fresh database with the schema migrated, dropped when
	// t ends. The suite opens one per specification.
	Open func(t *testing.T) *sql.DB
	// Orders is the dialect's order and payment SQL
	// (idempotency.MySQLOrders, idempotency.PostgresOrders).
	Orders idempotency.Orders
	// Placeholder is the dialect's placeholder for a statement's first
	// parameter ("?", "$1"): the suite's own queries take one.
	Placeholder string
	// ConnectionID selects the id of the connection it runs on, as
	// LockWaits takes it ("SELECT CONNECTION_ID()", "SELECT
	// pg_backend_pid()").
	ConnectionID string
	// LockWaits counts the lock waits of the connection whose id is its
	// one parameter: it is how the suite sees that a transaction waits for
	// another's lock.
	LockWaits string
	// LockWaitPoll is how often LockWaits may be run while the suite waits
	// for a transaction to block or finish.
	LockWaitPoll time.Duration
	// TxOptions are the options of the transactions events are applied
	// in, as the front-end's Config.TxOptions gives them (nil: the
	// database's default isolation).
	TxOptions *sql.TxOptions
	// OrdersWait says that events of different orders may wait for each
	// other at TxOptions (MySQL-family servers at REPEATABLE READ, whose
	// locking reads lock index gaps): the specification that they never
	// do is left out. The state machine is correct either way.
	OrdersWait bool
	// Counted opens a database as Open does whose connections count the
	// statements they send (each Exec and Query below database/sql, BEGIN,
	// COMMIT and ROLLBACK), and returns the count so far. Nil leaves out
	// the specification of how many statements each path sends.
	Counted func(t *testing.T) (db *sql.DB, sent func() int)
}

// Exercise runs the conformance suite on e. Each specification is a
// parallel subtest over a database of its own.
func Exercise(t *testing.T, e Engine) {
	exerciseDeliveryOrders(t, e)
	exerciseEvents(t, e)
	exerciseAnomalies(t, e)
	exerciseRefundIdentity(t, e)
	exerciseStatements(t, e)
	if !e.OrdersWait {
		exerciseIndependence(t, e)
	}
}

// bundle is one migrated database and the SQL to inspect it.
type bundle struct {
	db     *sql.DB
	orders idempotency.Orders
	engine Engine
}

func newBundle(t *testing.T, e Engine) *bundle {
	t.Helper()
	return &bundle{db: e.Open(t), orders: e.Orders, engine: e}
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

// refundOf is one event that tells of the refund refundID: a provider
// tells of one refund in several events (Stripe's refund.created,
// refund.updated, charge.refund.updated), each with an event id of its own.
func (r run) refundOf(id, refundID string, amount int64) idempotency.PaymentEvent {
	ev := r.refund(id, amount)
	ev.RefundID = "re-" + refundID + string(r)
	return ev
}

// total is an event that reports the payment's whole refunded amount so far
// (Stripe's charge.refunded, Alipay's refund_fee).
func (r run) total(id string, amount int64) idempotency.PaymentEvent {
	ev := r.refund(id, amount)
	ev.Kind = idempotency.PaymentRefundedTotal
	return ev
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
func (b *bundle) createOrder(t *testing.T, r run) {
	t.Helper()
	coupon := int64(3)
	o := &idempotency.Order{
		OrderNo: r.order(), Scope: "7", IdempotencyKey: "k" + string(r),
		UserID: 7, SKUID: 20001, Quantity: 2, CouponID: &coupon,
		UnitPriceCents: 1000, DiscountCents: 500, TotalCents: 1500,
		Currency: "CNY",
	}
	b.inTx(t, func(tx *sql.Tx) error { return b.orders.Create(context.Background(), tx, o) })
}

func (b *bundle) inTx(t *testing.T, f func(tx *sql.Tx) error) {
	t.Helper()
	tx, err := b.db.BeginTx(context.Background(), b.engine.TxOptions)
	require.NoError(t, err)
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
}

func (b *bundle) apply(t *testing.T, ev idempotency.PaymentEvent) idempotency.PaymentOutcome {
	t.Helper()
	var out idempotency.PaymentOutcome
	b.inTx(t, func(tx *sql.Tx) (err error) {
		out, err = b.orders.ApplyPayment(context.Background(), tx, ev)
		return err
	})
	return out
}

func (b *bundle) cancel(t *testing.T, r run) idempotency.OrderStatus {
	t.Helper()
	var st idempotency.OrderStatus
	b.inTx(t, func(tx *sql.Tx) (err error) {
		st, err = b.orders.RequestCancel(context.Background(), tx, r.order())
		return err
	})
	return st
}

// rows reads a query's rows as text, one line per row. A "?" in query is
// the engine's placeholder for the first parameter.
func (b *bundle) rows(t *testing.T, query string, args ...any) []string {
	t.Helper()
	rows, err := b.db.Query(strings.ReplaceAll(query, "?", b.engine.Placeholder), args...)
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

func (b *bundle) facts(t *testing.T, r run) recordedFacts {
	t.Helper()
	f := recordedFacts{
		Order: b.rows(t, `SELECT status, cancel_requested, currency, total_cents FROM purchase_order WHERE order_no = ?`, r.order()),
		Payment: b.rows(t, `SELECT provider, payment_id, COALESCE(order_no, ''), status, COALESCE(amount_cents, 0),
  COALESCE(currency, ''), refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
  FROM order_payment WHERE payment_id = ?`, r.payment()),
		Events: b.rows(t, `SELECT provider, event_id, kind, payment_id, COALESCE(refund_id, ''), COALESCE(order_no, ''), amount_cents,
  currency, digest, outcome, COALESCE(reason, '') FROM payment_event WHERE payment_id = ? ORDER BY event_id`, r.payment()),
		Anomalies: b.rows(t, `SELECT provider, event_id, kind, payment_id, COALESCE(order_no, ''), amount_cents, currency, digest,
  reason FROM payment_anomaly WHERE payment_id = ? ORDER BY event_id, reason`, r.payment()),
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

// requireEnd checks the end a case must reach, so that the permutations
// cannot all agree on a wrong one.
func requireEnd(t *testing.T, b *bundle, r run, status idempotency.OrderStatus, refunded, owed int64) {
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
