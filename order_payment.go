package idempotency

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The payment state machine: provider events (a payment's success, its
// refunds) and the user's cancel request move an order, in the caller's
// transaction, so that the delivery order of the events never changes where
// the order ends.
//
// # The order's state is a function of its facts
//
// An order has three facts, and its status is derived from them, never
// chosen by the event at hand:
//
//   - paid: a success event whose amount and currency equal the order's
//     was applied to a payment of this order (a row of order_payment);
//   - R, the refunded amount: the larger of S, the sum of the distinct
//     refunds applied to that payment (one refund counts once, however
//     many events tell of it: PaymentEvent.RefundID), and T, the largest
//     refunded total the provider reported for it (PaymentRefundedTotal).
//     S and T may count the same money (Stripe tells of one refund in
//     refund.created and in charge.refunded's total), so they never add
//     up. Neither is ever above the amount paid: a refund that would
//     bring S above it, or a total above it, is an anomaly and is not
//     applied;
//   - C, cancel requested: RequestCancel was called (or the order was
//     moved to CANCELED before this file existed).
//
// The status is:
//
//	not paid:            C ? CANCELED : CREATED
//	paid, R == amount:   REFUNDED
//	paid, R <  amount:   C ? CANCELED : PAID   (CANCELED and paid: a refund is owed)
//
// Every fact only grows (S by each new refund, T to each larger total, R
// as their maximum), and S, T and R depend on the set of events, not on
// their order, so every permutation of the same events ends in the same
// facts, hence the same status. A refund that arrives before its
// payment's success names a payment no success has settled yet: it is kept
// PENDING on a payment row created PENDING (amount unknown), and the
// success applies it, in arrival order, when it settles the payment. A
// refund whose payment never succeeds stays pending and changes nothing.
//
// "Refund owed" is derived too, not logged: a CANCELED order with a settled
// payment whose refunds do not cover it owes amount - R. ListAnomalies
// lists it with the other anomalies, and an outcome reports it, but no row
// records it, so "success then cancel" and "cancel then success" (then the
// refund) leave the same rows.
//
// # Same recorded facts
//
// Two deliveries of the same events in different orders leave the same
// recorded facts: the order row (status, cancel_requested, currency), the
// payment rows (every column but the times), the event rows (every column
// but id and created_at: the outcome of a refund that waited is rewritten
// when its payment settles) and the anomaly rows (every column but id and
// created_at), and so the same ListAnomalies answer but for its times.
// What may differ is only when and in which sequence things happened: ids,
// timestamps. This holds for events that are consistent with one another
// (refunds summing to at most the payment); which of several refunds is the
// one that would exceed the payment, which of two payments of one order
// settles it, and which of the events that tell of one refund is the one
// that applies (the first to arrive; the others are NOOP), are decided by
// arrival, as they must be.
//
// # Transactions and locks
//
// Every function takes the caller's *sql.Tx (the idempotency record's
// transaction) and never commits: the event's effects and the record that
// answers its redelivery commit together. Locks are taken in one order,
// order row, then payment row, then event rows, so two transactions never
// wait on each other in a cycle:
//
//   - a success locks its order (SELECT ... FOR UPDATE), then its payment
//     (created PENDING if absent);
//   - the event's row (unique (provider, event_id)) is inserted after those
//     locks and before any other write: a second delivery of the same event
//     waits for the first, finds the id taken and writes nothing more. So
//     every event row naming a payment is written under that payment's
//     lock, and a success that reads the refunds waiting for its payment
//     never meets one that is being written; nor does a refund that looks,
//     under the same lock, for another event of its RefundID that applied
//     or waits (the unique index on (provider, refund_id) of the APPLIED
//     events refuses a second application that did not follow this);
//   - a refund reads which order its payment belongs to (an order number,
//     once set, never changes), locks that order, then the payment; a
//     refund whose payment is not settled locks only the payment row, and
//     if it finds the payment settled by a transaction that committed in
//     between, it does not reach back for the order lock: it fails with
//     ErrPaymentConflict, which the caller retries;
//   - RequestCancel locks the order and reads its payments with a shared
//     lock (every writer of a settled payment holds its order's lock).
//
// Each write is guarded by the state read under the lock (UPDATE ...
// WHERE status = read): a guard that matches no row means another writer
// did not follow the protocol, and is ErrPaymentConflict too. On SQLite,
// whose transactions begin IMMEDIATE and hold the database's write lock,
// the statements need no locking clauses (SQLiteOrders).
//
// On MySQL/MariaDB at REPEATABLE READ, the locking reads of a range
// (the settled payments of an order, the refunds waiting for a payment)
// also take InnoDB gap locks, so two transactions for different orders
// whose rows sit next to each other in an index can still deadlock: InnoDB
// rolls one back with error 1213, which IsTransient reports, and the caller
// retries it as it retries ErrPaymentConflict. On PostgreSQL at REPEATABLE
// READ, a row changed since the snapshot fails with 40001, transient too.

// PaymentKind is what a provider event says happened to a payment.
type PaymentKind string

// Payment event kinds.
const (
	// PaymentSucceeded: the provider took the money.
	PaymentSucceeded PaymentKind = "SUCCEEDED"
	// PaymentRefundedTotal: the provider reports the payment's whole
	// refunded amount so far as Amount (Alipay's refund_fee, Stripe's
	// charge.amount_refunded), not one refund's. The payment keeps the
	// largest total reported, and its refunded amount is the larger of
	// that total and the sum of its distinct refunds, since both count the
	// same money: a total never adds to the refunds, and a refund never
	// adds to a total. A total at or under the largest reported changes
	// nothing. Totals reported in any order end at the largest.
	PaymentRefundedTotal PaymentKind = "REFUNDED_TOTAL"
	// PaymentRefunded: the provider gave Amount of it back (in full or in
	// part).
	PaymentRefunded PaymentKind = "REFUNDED"
)

// PaymentEvent is one verified provider event, as a webhook front-end
// translates it. Verify the provider's signature before building one: the
// store trusts every field.
type PaymentEvent struct {
	// Provider names the payment provider ("stripe", "alipay"): at most 32
	// bytes. Event and payment ids are unique per provider.
	Provider string
	// EventID is the provider's id of this event (at most 255 bytes): the
	// same id delivered twice is one event.
	EventID string
	// PaymentID is the provider's id of the payment (at most 255 bytes): a
	// refund names the payment it refunds, not the order.
	PaymentID string
	// OrderNo is the order the payment pays: required for a success;
	// optional for a refund, whose order is its payment's (a refund that
	// names another order is an anomaly).
	OrderNo string
	// Kind is PaymentSucceeded, PaymentRefunded or PaymentRefundedTotal.
	Kind PaymentKind
	// RefundID is the provider's id of the one refund a PaymentRefunded
	// tells of (at most 255 bytes); "" for a success, a reported total, or
	// a refund of a provider that gives refunds no id. A provider may tell
	// of one refund in several events (Stripe's refund.created,
	// refund.updated and charge.refund.updated): the first that applies or
	// waits counts, and the others with the same RefundID change nothing.
	// A refund without a RefundID counts as a refund of its own.
	RefundID string
	// Amount is the amount paid or refunded in minor units (cents, fen):
	// above zero.
	Amount int64
	// Currency is the ISO 4217 code of Amount, in any case; it is stored in
	// upper case.
	Currency string
	// Digest identifies the event's payload (a hash of the verified body,
	// at most 128 bytes): the same EventID with another digest is an
	// anomaly, never applied. Empty means a SHA-256 of the fields above.
	Digest string
}

// AnomalyReason says why a verified event could not apply, or what an
// order's facts owe.
type AnomalyReason string

// Anomaly reasons. An anomalous event is recorded (payment_event, and
// payment_anomaly with its reason) and reported in the outcome, not as an
// error: the caller acknowledges the provider, which must not send it again
// for ever, and an operator settles it (ListAnomalies).
const (
	// AnomalyUnknownOrder: a success names an order that does not exist.
	AnomalyUnknownOrder AnomalyReason = "unknown-order"
	// AnomalyAmountMismatch: a success's amount is not the order's total,
	// or not the amount of the payment it repeats.
	AnomalyAmountMismatch AnomalyReason = "amount-mismatch"
	// AnomalyCurrencyMismatch: a success's currency is not the order's, or
	// a refund's is not its payment's.
	AnomalyCurrencyMismatch AnomalyReason = "currency-mismatch"
	// AnomalyOrderMismatch: the event names an order other than the one
	// its payment already pays.
	AnomalyOrderMismatch AnomalyReason = "order-mismatch"
	// AnomalyDoublePayment: a second payment succeeded for an order that
	// another payment already paid. It is not applied: its money is owed
	// back to the payer.
	AnomalyDoublePayment AnomalyReason = "double-payment"
	// AnomalyRefundExceedsPayment: the refund would bring the refunded
	// amount above the amount paid. It is not applied.
	AnomalyRefundExceedsPayment AnomalyReason = "refund-exceeds-payment"
	// AnomalyPayloadMismatch: an event id already recorded arrived with
	// another payload digest. It is not applied.
	AnomalyPayloadMismatch AnomalyReason = "payload-mismatch"
	// AnomalyRefundOwed: the order is CANCELED but a payment of it is
	// settled and not refunded in full (a success after the user's cancel,
	// or a cancel after the success). It is derived from the facts, not
	// recorded: it ends when the refunds cover the payment.
	AnomalyRefundOwed AnomalyReason = "refund-owed"
)

// PaymentOutcome is what ApplyPayment did with one event. It is never an
// error to report to the provider: every outcome is final for this event
// id, so the caller acknowledges it.
type PaymentOutcome struct {
	// Applied: the event changed the payment facts (a success settled its
	// payment, a refund added to the sum of the refunds, a total raised the
	// largest total reported). None of Applied, Pending, Duplicate and
	// Anomaly: the event was recorded and changed nothing (a success
	// repeated under another event id, a total at or under the largest
	// reported, a refund whose RefundID applied or waits already).
	Applied bool
	// Pending: a refund whose payment has not succeeded yet was kept for
	// the success to apply.
	Pending bool
	// Duplicate: the event id was recorded before; nothing changed, and
	// the other fields repeat what the first delivery did.
	Duplicate bool
	// Anomaly is why the event did not apply, or AnomalyRefundOwed when it
	// applied to (or left) a canceled order that owes a refund; "" when
	// all is well.
	Anomaly AnomalyReason
	// OrderNo is the order the event concerns, "" when no order is known
	// (a pending refund).
	OrderNo string
	// Status is the order's state after the event, "" when OrderNo is ""
	// or names no order.
	Status OrderStatus
}

// PaymentStatus is the state of an order_payment row.
type PaymentStatus string

// Payment states.
const (
	// PaymentPending: only refunds have named the payment so far; its
	// order, amount and currency are unknown.
	PaymentPending PaymentStatus = "PENDING"
	// PaymentSettled: its success event applied.
	PaymentSettled PaymentStatus = "SUCCEEDED"
)

// Payment is an order_payment row: the facts of one provider payment.
type Payment struct {
	Provider  string
	PaymentID string
	OrderNo   string // "" while pending
	Status    PaymentStatus
	// AmountCents and Currency are the success's, 0 and "" while pending.
	AmountCents int64
	Currency    string
	// RefundedCents is the refunded amount the order's state derives
	// from: the larger of RefundedSumCents and RefundedReportedCents,
	// never above AmountCents.
	RefundedCents int64
	// RefundedSumCents is the sum of the distinct refunds applied (each
	// RefundID once).
	RefundedSumCents int64
	// RefundedReportedCents is the largest refunded total the provider
	// reported (PaymentRefundedTotal).
	RefundedReportedCents int64
	// EventsApplied counts the success and the refunds and totals applied.
	EventsApplied int
}

// PaymentAnomaly is one row of ListAnomalies: an event that could not
// apply, or a refund owed.
type PaymentAnomaly struct {
	Reason    AnomalyReason
	Provider  string
	EventID   string // for AnomalyRefundOwed, the payment's success event
	Kind      PaymentKind
	PaymentID string
	OrderNo   string // "" when the event named none and its payment has none
	// AmountCents is the event's amount; for AnomalyRefundOwed, the amount
	// owed.
	AmountCents int64
	Currency    string
	Digest      string
	// At is when the anomaly was recorded; for AnomalyRefundOwed, when its
	// order last changed.
	At time.Time
}

var (
	// ErrPaymentConflict means the order or payment changed between this
	// transaction's read and its write, which the lock protocol allows only
	// when a refund meets its payment's success committing: roll back and
	// retry the event. It wraps ErrTransient, so IsTransient reports it.
	ErrPaymentConflict = fmt.Errorf("idempotency: order or payment changed under the event; roll back and retry it: %w", ErrTransient)

	// ErrInvalidPaymentEvent means a PaymentEvent lacks a field or has one
	// out of bounds: a bug in the front-end that built it.
	ErrInvalidPaymentEvent = errors.New("idempotency: invalid payment event")

	// ErrPaymentNotFound means no order_payment row has the provider and
	// payment id.
	ErrPaymentNotFound = errors.New("idempotency: payment not found")
)

// Event outcomes as payment_event records them.
const (
	eventApplied = "APPLIED"
	eventPending = "PENDING"
	eventNoop    = "NOOP"
	eventAnomaly = "ANOMALY"
)

// PaymentStatements is the SQL of the payment state machine in one dialect,
// a field of Orders. Placeholders are ? or $n; the parameters are listed in
// order.
type PaymentStatements struct {
	// InsertEvent records an event, claiming its (provider, event_id).
	// Parameters: provider, event_id, kind, payment_id, refund_id (or
	// NULL), order_no (or NULL), amount_cents, currency, digest, outcome. A duplicate either fails with
	// a unique violation or inserts no row.
	InsertEvent string
	// SelectEvent reads a recorded event as the latest committed version
	// (a locking read on MySQL). Parameters: provider, event_id. Columns:
	// kind, payment_id, order_no, digest, outcome, reason.
	SelectEvent string
	// UpdateEventOutcome sets an event's outcome. Parameters: outcome,
	// reason (or NULL), order_no (or NULL), provider, event_id.
	UpdateEventOutcome string
	// InsertAnomaly records an event that could not apply, once per
	// (provider, event_id, digest, reason). Parameters: provider, event_id,
	// kind, payment_id, order_no (or NULL), amount_cents, currency, digest,
	// reason.
	InsertAnomaly string
	// LockOrder locks an order row and reads its facts. Parameter:
	// order_no. Columns: status, cancel_requested, total_cents, currency.
	LockOrder string
	// UpdateOrderFacts moves an order to its derived state, guarded by the
	// state read under the lock. Parameters: status, cancel_requested,
	// order_no, the status read.
	UpdateOrderFacts string
	// SelectPaymentOrder reads a payment's order number without a lock.
	// Parameters: provider, payment_id. Column: order_no (NULL while
	// pending).
	SelectPaymentOrder string
	// InsertPendingPayment creates a PENDING payment unless it exists.
	// Parameters: provider, payment_id.
	InsertPendingPayment string
	// LockPayment locks a payment row and reads it. Parameters: provider,
	// payment_id. Columns: Payment's fields from OrderNo on.
	LockPayment string
	// SelectPayment reads a payment without a lock, as LockPayment.
	SelectPayment string
	// SettlePayment settles a pending payment. Parameters: order_no,
	// amount_cents, currency, refunded_cents, refunded_sum_cents,
	// refunded_reported_cents, events_applied, provider, payment_id.
	SettlePayment string
	// UpdatePaymentRefund sets a settled payment's refunded amounts,
	// guarded by the events_applied read under the lock (every write of a
	// payment raises it). Parameters: refunded_cents, refunded_sum_cents,
	// refunded_reported_cents, events_applied, provider, payment_id, the
	// events_applied read.
	UpdatePaymentRefund string
	// SelectOrderPayments reads the settled payments of an order with a
	// shared lock (their latest committed version). Parameter: order_no.
	// Columns: provider, payment_id, amount_cents, refunded_cents.
	SelectOrderPayments string
	// SelectPendingRefunds locks the refunds waiting for a payment, in
	// arrival order. Parameters: provider, payment_id. Columns: event_id,
	// refund_id, order_no, kind, amount_cents, currency, digest.
	SelectPendingRefunds string
	// SelectRefundTold reads another event of the same refund that applied
	// or waits, as the latest committed version (a locking read on MySQL),
	// under the lock of the refund's payment. Parameters: provider,
	// refund_id, the event_id to leave out. Column: event_id; no row when
	// the refund is new.
	SelectRefundTold string
	// ListAnomalies lists the recorded anomalies and the refunds owed,
	// newest first. Parameter: the limit. Columns: PaymentAnomaly's fields
	// in order.
	ListAnomalies string
}

var mysqlPayments = PaymentStatements{
	InsertEvent: `INSERT INTO payment_event
  (provider, event_id, kind, payment_id, refund_id, order_no, amount_cents, currency, digest, outcome)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	SelectEvent:        `SELECT kind, payment_id, order_no, digest, outcome, reason FROM payment_event WHERE provider = ? AND event_id = ? LOCK IN SHARE MODE`,
	UpdateEventOutcome: `UPDATE payment_event SET outcome = ?, reason = ?, order_no = COALESCE(order_no, ?) WHERE provider = ? AND event_id = ?`,
	InsertAnomaly: `INSERT INTO payment_anomaly
  (provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE id = id`,
	LockOrder:            `SELECT status, cancel_requested, total_cents, currency FROM purchase_order WHERE order_no = ? FOR UPDATE`,
	UpdateOrderFacts:     `UPDATE purchase_order SET status = ?, cancel_requested = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE order_no = ? AND status = ?`,
	SelectPaymentOrder:   `SELECT order_no FROM order_payment WHERE provider = ? AND payment_id = ?`,
	InsertPendingPayment: `INSERT INTO order_payment (provider, payment_id, status) VALUES (?, ?, 'PENDING') ON DUPLICATE KEY UPDATE provider = provider`,
	LockPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = ? AND payment_id = ? FOR UPDATE`,
	SelectPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = ? AND payment_id = ?`,
	SettlePayment: `UPDATE order_payment SET status = 'SUCCEEDED', order_no = ?, amount_cents = ?, currency = ?,
  refunded_cents = ?, refunded_sum_cents = ?, refunded_reported_cents = ?, events_applied = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE provider = ? AND payment_id = ? AND status = 'PENDING'`,
	UpdatePaymentRefund: `UPDATE order_payment SET refunded_cents = ?, refunded_sum_cents = ?, refunded_reported_cents = ?,
  events_applied = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE provider = ? AND payment_id = ? AND status = 'SUCCEEDED' AND events_applied = ?`,
	SelectOrderPayments: `SELECT provider, payment_id, amount_cents, refunded_cents FROM order_payment
WHERE order_no = ? AND status = 'SUCCEEDED' ORDER BY provider, payment_id LOCK IN SHARE MODE`,
	SelectPendingRefunds: `SELECT event_id, refund_id, order_no, kind, amount_cents, currency, digest FROM payment_event
WHERE provider = ? AND payment_id = ? AND outcome = 'PENDING' AND kind IN ('REFUNDED', 'REFUNDED_TOTAL') ORDER BY id FOR UPDATE`,
	SelectRefundTold: `SELECT event_id FROM payment_event
WHERE provider = ? AND refund_id = ? AND outcome IN ('APPLIED', 'PENDING') AND event_id <> ? LIMIT 1 LOCK IN SHARE MODE`,
	ListAnomalies: `SELECT reason, provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, at FROM (
  SELECT a.reason, a.provider, a.event_id, a.kind, a.payment_id, a.order_no, a.amount_cents, a.currency, a.digest, a.created_at AS at
  FROM payment_anomaly a
  UNION ALL
  SELECT 'refund-owed', p.provider, COALESCE(e.event_id, ''), 'SUCCEEDED', p.payment_id, p.order_no,
    p.amount_cents - p.refunded_cents, p.currency, COALESCE(e.digest, ''), o.updated_at
  FROM order_payment p
  JOIN purchase_order o ON o.order_no = p.order_no
  LEFT JOIN payment_event e ON e.provider = p.provider AND e.payment_id = p.payment_id
    AND e.kind = 'SUCCEEDED' AND e.outcome = 'APPLIED'
  WHERE p.status = 'SUCCEEDED' AND o.status = 'CANCELED' AND p.refunded_cents < p.amount_cents
) x ORDER BY at DESC, provider, event_id, payment_id, reason LIMIT ?`,
}

var postgresPayments = PaymentStatements{
	InsertEvent: `INSERT INTO payment_event
  (provider, event_id, kind, payment_id, refund_id, order_no, amount_cents, currency, digest, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (provider, event_id) DO NOTHING`,
	SelectEvent:        `SELECT kind, payment_id, order_no, digest, outcome, reason FROM payment_event WHERE provider = $1 AND event_id = $2`,
	UpdateEventOutcome: `UPDATE payment_event SET outcome = $1, reason = $2, order_no = COALESCE(order_no, $3) WHERE provider = $4 AND event_id = $5`,
	InsertAnomaly: `INSERT INTO payment_anomaly
  (provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (provider, event_id, digest, reason) DO NOTHING`,
	LockOrder:            `SELECT status, cancel_requested, total_cents, currency FROM purchase_order WHERE order_no = $1 FOR UPDATE`,
	UpdateOrderFacts:     `UPDATE purchase_order SET status = $1, cancel_requested = $2, updated_at = clock_timestamp() WHERE order_no = $3 AND status = $4`,
	SelectPaymentOrder:   `SELECT order_no FROM order_payment WHERE provider = $1 AND payment_id = $2`,
	InsertPendingPayment: `INSERT INTO order_payment (provider, payment_id, status) VALUES ($1, $2, 'PENDING') ON CONFLICT (provider, payment_id) DO NOTHING`,
	LockPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = $1 AND payment_id = $2 FOR UPDATE`,
	SelectPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = $1 AND payment_id = $2`,
	SettlePayment: `UPDATE order_payment SET status = 'SUCCEEDED', order_no = $1, amount_cents = $2, currency = $3,
  refunded_cents = $4, refunded_sum_cents = $5, refunded_reported_cents = $6, events_applied = $7, updated_at = clock_timestamp()
WHERE provider = $8 AND payment_id = $9 AND status = 'PENDING'`,
	UpdatePaymentRefund: `UPDATE order_payment SET refunded_cents = $1, refunded_sum_cents = $2, refunded_reported_cents = $3,
  events_applied = $4, updated_at = clock_timestamp()
WHERE provider = $5 AND payment_id = $6 AND status = 'SUCCEEDED' AND events_applied = $7`,
	SelectOrderPayments: `SELECT provider, payment_id, amount_cents, refunded_cents FROM order_payment
WHERE order_no = $1 AND status = 'SUCCEEDED' ORDER BY provider, payment_id FOR SHARE`,
	SelectPendingRefunds: `SELECT event_id, refund_id, order_no, kind, amount_cents, currency, digest FROM payment_event
WHERE provider = $1 AND payment_id = $2 AND outcome = 'PENDING' AND kind IN ('REFUNDED', 'REFUNDED_TOTAL') ORDER BY id FOR UPDATE`,
	SelectRefundTold: `SELECT event_id FROM payment_event
WHERE provider = $1 AND refund_id = $2 AND outcome IN ('APPLIED', 'PENDING') AND event_id <> $3 LIMIT 1`,
	ListAnomalies: `SELECT reason, provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, at FROM (
  SELECT a.reason, a.provider, a.event_id, a.kind, a.payment_id, a.order_no, a.amount_cents, a.currency, a.digest, a.created_at AS at
  FROM payment_anomaly a
  UNION ALL
  SELECT 'refund-owed', p.provider, COALESCE(e.event_id, ''), 'SUCCEEDED', p.payment_id, p.order_no,
    p.amount_cents - p.refunded_cents, p.currency, COALESCE(e.digest, ''), o.updated_at
  FROM order_payment p
  JOIN purchase_order o ON o.order_no = p.order_no
  LEFT JOIN payment_event e ON e.provider = p.provider AND e.payment_id = p.payment_id
    AND e.kind = 'SUCCEEDED' AND e.outcome = 'APPLIED'
  WHERE p.status = 'SUCCEEDED' AND o.status = 'CANCELED' AND p.refunded_cents < p.amount_cents
) x ORDER BY at DESC, provider, event_id, payment_id, reason LIMIT $1`,
}

// sqlitePayments is mysqlPayments without locking clauses, which SQLite
// does not have and does not need: its transactions begin IMMEDIATE (package
// sqlite's Open) and hold the database's write lock throughout.
var sqlitePayments = func() PaymentStatements {
	p := mysqlPayments
	for _, f := range []*string{&p.SelectEvent, &p.LockOrder, &p.LockPayment, &p.SelectOrderPayments, &p.SelectPendingRefunds, &p.SelectRefundTold} {
		*f = strings.TrimSuffix(strings.TrimSuffix(*f, " LOCK IN SHARE MODE"), " FOR UPDATE")
	}
	p.InsertAnomaly = strings.Replace(p.InsertAnomaly, "ON DUPLICATE KEY UPDATE id = id", "ON CONFLICT (provider, event_id, digest, reason) DO NOTHING", 1)
	p.InsertPendingPayment = strings.Replace(p.InsertPendingPayment, "ON DUPLICATE KEY UPDATE provider = provider", "ON CONFLICT (provider, payment_id) DO NOTHING", 1)
	p.UpdateOrderFacts = strings.Replace(p.UpdateOrderFacts, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	p.SettlePayment = strings.Replace(p.SettlePayment, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	p.UpdatePaymentRefund = strings.Replace(p.UpdatePaymentRefund, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	return p
}()

// SQLiteOrders is the order SQL of SQLite: MySQLOrders' order statements,
// which SQLite runs as they are, and the payment statements without the
// locking clauses SQLite lacks (package sqlite's transactions hold the
// write lock from BEGIN).
var SQLiteOrders = func() Orders {
	o := MySQLOrders
	o.Payments = sqlitePayments
	return o
}()

// orderFacts are the facts an order's status is derived from.
type orderFacts struct {
	paid     bool
	amount   int64 // paid, when paid
	refunded int64 // R: at most amount
	cancel   bool  // C
}

// status is the state the facts put the order in (see the top of this
// file).
func (f orderFacts) status() OrderStatus {
	switch {
	case !f.paid && f.cancel:
		return OrderCanceled
	case !f.paid:
		return OrderCreated
	case f.refunded >= f.amount:
		return OrderRefunded
	case f.cancel:
		return OrderCanceled
	default:
		return OrderPaid
	}
}

// refundOwed is what a canceled, paid order still owes its payer.
func (f orderFacts) refundOwed() int64 {
	if f.paid && f.cancel && f.refunded < f.amount {
		return f.amount - f.refunded
	}
	return 0
}

// lockedOrder is an order row read under its lock.
type lockedOrder struct {
	orderNo  string
	status   OrderStatus
	flag     bool // cancel_requested as stored
	total    int64
	currency string
}

// cancel is the fact C: requested through RequestCancel, or CANCELED by a
// Transition before payments were recorded.
func (o lockedOrder) cancel() bool { return o.flag || o.status == OrderCanceled }

// normalize checks ev and fills its defaults.
func (ev PaymentEvent) normalize() (PaymentEvent, error) {
	ev.Currency = strings.ToUpper(ev.Currency)
	if ev.Digest == "" {
		fields := []string{
			ev.Provider, ev.EventID, ev.PaymentID, ev.OrderNo, string(ev.Kind),
			strconv.FormatInt(ev.Amount, 10), ev.Currency,
		}
		if ev.RefundID != "" {
			fields = append(fields, ev.RefundID)
		}
		sum := sha256.Sum256([]byte(strings.Join(fields, "\x00")))
		ev.Digest = hex.EncodeToString(sum[:])
	}
	var problem string
	switch {
	case ev.Provider == "" || len(ev.Provider) > 32:
		problem = "Provider must be 1 to 32 bytes"
	case ev.EventID == "" || len(ev.EventID) > 255:
		problem = "EventID must be 1 to 255 bytes"
	case ev.PaymentID == "" || len(ev.PaymentID) > 255:
		problem = "PaymentID must be 1 to 255 bytes"
	case len(ev.OrderNo) > 64:
		problem = "OrderNo must be at most 64 bytes"
	case ev.Kind != PaymentSucceeded && ev.Kind != PaymentRefunded && ev.Kind != PaymentRefundedTotal:
		problem = fmt.Sprintf("Kind %q is not PaymentSucceeded, PaymentRefunded or PaymentRefundedTotal", ev.Kind)
	case len(ev.RefundID) > 255:
		problem = "RefundID must be at most 255 bytes"
	case ev.RefundID != "" && ev.Kind != PaymentRefunded:
		problem = "RefundID names one refund: only a PaymentRefunded has one"
	case ev.Amount <= 0:
		problem = "Amount must be above zero"
	case len(ev.Currency) != 3 || strings.Trim(ev.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "":
		problem = "Currency must be an ISO 4217 code of three letters"
	case len(ev.Digest) > 128:
		problem = "Digest must be at most 128 bytes"
	}
	if problem != "" {
		return ev, fmt.Errorf("%w: event %q of %q: %s", ErrInvalidPaymentEvent, ev.EventID, ev.Provider, problem)
	}
	return ev, nil
}

// nullable turns "" into NULL.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ApplyPayment applies one verified provider event inside tx and never
// commits: the caller commits it with the idempotency record that answers
// the event's redelivery, then acknowledges the provider.
//
// A success settles its payment and derives its order's state: CREATED →
// PAID; a CANCELED order stays CANCELED and owes a refund (Anomaly
// AnomalyRefundOwed); refunds that arrived first apply now. A refund adds
// to its payment's refunded amount (PAID → REFUNDED once it is whole;
// CANCELED → REFUNDED when the owed refund arrives), or waits (Pending)
// when its payment has not succeeded yet. An event that cannot apply is
// recorded as an anomaly and reported in the outcome; the same event id
// again is a Duplicate and changes nothing.
//
// Errors are for the caller to retry, not to acknowledge: a database
// failure, ErrPaymentConflict (transient: roll back and apply the event
// again), or ErrInvalidPaymentEvent for an event the front-end built wrong.
// On PostgreSQL an error leaves tx aborted; roll it back.
func (s Orders) ApplyPayment(ctx context.Context, tx *sql.Tx, ev PaymentEvent) (PaymentOutcome, error) {
	out, err := s.applyPayment(ctx, tx, ev)
	return out, conflicted(err)
}

func (s Orders) applyPayment(ctx context.Context, tx *sql.Tx, ev PaymentEvent) (PaymentOutcome, error) {
	ev, err := ev.normalize()
	if err != nil {
		return PaymentOutcome{}, err
	}
	claim := func() error {
		claimed, err := s.claimEvent(ctx, tx, ev)
		if err == nil && !claimed {
			return errDuplicateEvent
		}
		return err
	}
	var out PaymentOutcome
	var outcome string
	if ev.Kind == PaymentSucceeded {
		out, outcome, err = s.applySuccess(ctx, tx, ev, claim)
	} else {
		out, outcome, err = s.applyRefund(ctx, tx, ev, claim)
	}
	if errors.Is(err, errDuplicateEvent) {
		return s.duplicateEvent(ctx, tx, ev)
	}
	if err != nil {
		return PaymentOutcome{}, err
	}
	if outcome == eventAnomaly {
		return out, s.recordAnomaly(ctx, tx, ev, out.OrderNo, out.Anomaly)
	}
	return out, s.setEventOutcome(ctx, tx, ev.Provider, ev.EventID, outcome, "", out.OrderNo)
}

// errDuplicateEvent stops an event whose id is recorded before it writes
// anything but what its first delivery wrote too.
var errDuplicateEvent = errors.New("idempotency: payment event recorded before")

// claimEvent inserts the event's row, or reports that its id is taken.
func (s Orders) claimEvent(ctx context.Context, tx *sql.Tx, ev PaymentEvent) (bool, error) {
	res, err := tx.ExecContext(ctx, s.Payments.InsertEvent,
		ev.Provider, ev.EventID, string(ev.Kind), ev.PaymentID, nullable(ev.RefundID), nullable(ev.OrderNo),
		ev.Amount, ev.Currency, ev.Digest, eventPending)
	if err != nil {
		if isUniqueViolation(err) {
			return false, nil
		}
		return false, fmt.Errorf("idempotency: record payment event: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idempotency: record payment event: %w", err)
	}
	return n == 1, nil
}

// duplicateEvent answers an event whose id is recorded: the first
// delivery's outcome, or AnomalyPayloadMismatch for another payload.
func (s Orders) duplicateEvent(ctx context.Context, tx *sql.Tx, ev PaymentEvent) (PaymentOutcome, error) {
	var kind, paymentID, digest, outcome string
	var orderNo, reason sql.NullString
	err := tx.QueryRowContext(ctx, s.Payments.SelectEvent, ev.Provider, ev.EventID).
		Scan(&kind, &paymentID, &orderNo, &digest, &outcome, &reason)
	if err != nil {
		return PaymentOutcome{}, fmt.Errorf("idempotency: read payment event: %w", err)
	}
	out := PaymentOutcome{Duplicate: true, OrderNo: orderNo.String}
	switch {
	case digest != ev.Digest:
		out.Anomaly = AnomalyPayloadMismatch
		if err := s.insertAnomaly(ctx, tx, ev, ev.OrderNo, AnomalyPayloadMismatch); err != nil {
			return PaymentOutcome{}, err
		}
	case outcome == eventApplied:
		out.Applied = true
	case outcome == eventPending:
		out.Pending = true
	case outcome == eventAnomaly:
		out.Anomaly = AnomalyReason(reason.String)
	}
	if out.OrderNo != "" {
		var status string
		err := tx.QueryRowContext(ctx, s.SelectStatus, out.OrderNo).Scan(&status)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return PaymentOutcome{}, fmt.Errorf("idempotency: read order status: %w", err)
		}
		out.Status = OrderStatus(status)
	}
	return out, nil
}

// applySuccess settles the event's payment: order lock, then payment lock.
func (s Orders) applySuccess(ctx context.Context, tx *sql.Tx, ev PaymentEvent, claim func() error) (PaymentOutcome, string, error) {
	anomaly := func(o *lockedOrder, reason AnomalyReason) (PaymentOutcome, string, error) {
		if err := claim(); err != nil {
			return PaymentOutcome{}, "", err
		}
		out := PaymentOutcome{OrderNo: ev.OrderNo, Anomaly: reason}
		if o != nil {
			out.Status = o.status
		}
		return out, eventAnomaly, nil
	}
	o, err := s.lockOrder(ctx, tx, ev.OrderNo)
	if errors.Is(err, ErrOrderNotFound) {
		return anomaly(nil, AnomalyUnknownOrder)
	}
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	if ev.Currency != strings.ToUpper(o.currency) {
		return anomaly(&o, AnomalyCurrencyMismatch)
	}
	if ev.Amount != o.total {
		return anomaly(&o, AnomalyAmountMismatch)
	}
	p, err := s.lockPayment(ctx, tx, ev.Provider, ev.PaymentID, true)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	if p.Status == PaymentSettled {
		if err := claim(); err != nil {
			return PaymentOutcome{}, "", err
		}
		// The same payment's success again, under another event id.
		switch {
		case p.OrderNo != ev.OrderNo:
			return anomaly(&o, AnomalyOrderMismatch)
		case p.AmountCents != ev.Amount:
			return anomaly(&o, AnomalyAmountMismatch)
		case p.Currency != ev.Currency:
			return anomaly(&o, AnomalyCurrencyMismatch)
		}
		f := orderFacts{paid: true, amount: p.AmountCents, refunded: p.RefundedCents, cancel: o.cancel()}
		return s.outcome(ev.OrderNo, o.status, f), eventNoop, nil
	}
	others, err := s.settledPayments(ctx, tx, ev.OrderNo)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	if len(others) > 0 {
		return anomaly(&o, AnomalyDoublePayment)
	}
	if err := claim(); err != nil {
		return PaymentOutcome{}, "", err
	}

	p.OrderNo, p.AmountCents, p.Currency, p.Status = ev.OrderNo, ev.Amount, ev.Currency, PaymentSettled
	p.EventsApplied++
	if err := s.applyPendingRefunds(ctx, tx, &p); err != nil {
		return PaymentOutcome{}, "", err
	}
	if err := s.exec(ctx, tx, "settle payment", s.Payments.SettlePayment,
		p.OrderNo, p.AmountCents, p.Currency, p.RefundedCents, p.RefundedSumCents, p.RefundedReportedCents,
		p.EventsApplied, p.Provider, p.PaymentID); err != nil {
		return PaymentOutcome{}, "", err
	}
	f := orderFacts{paid: true, amount: p.AmountCents, refunded: p.RefundedCents, cancel: o.cancel()}
	status, err := s.moveOrder(ctx, tx, o, f)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	out := s.outcome(ev.OrderNo, status, f)
	out.Applied = true
	return out, eventApplied, nil
}

// applyPendingRefunds applies, in arrival order, the refunds that waited
// for p's success, as if each had arrived after it: by the rules of
// addRefund, and a refund whose RefundID one before it applied is a NOOP.
func (s Orders) applyPendingRefunds(ctx context.Context, tx *sql.Tx, p *Payment) error {
	rows, err := tx.QueryContext(ctx, s.Payments.SelectPendingRefunds, p.Provider, p.PaymentID)
	if err != nil {
		return fmt.Errorf("idempotency: read pending refunds: %w", err)
	}
	var refunds []PaymentEvent
	for rows.Next() {
		r := PaymentEvent{Provider: p.Provider, PaymentID: p.PaymentID}
		var refundID, orderNo sql.NullString
		if err := rows.Scan(&r.EventID, &refundID, &orderNo, &r.Kind, &r.Amount, &r.Currency, &r.Digest); err != nil {
			rows.Close()
			return fmt.Errorf("idempotency: read pending refunds: %w", err)
		}
		r.RefundID, r.OrderNo = refundID.String, orderNo.String
		refunds = append(refunds, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idempotency: read pending refunds: %w", err)
	}
	rows.Close()
	// A refund told twice waits once (applyRefund finds the first waiting),
	// unless both were written at once where the database's snapshot hid
	// one from the other (PostgreSQL at REPEATABLE READ): the first applies.
	applied := map[string]bool{}
	for _, r := range refunds {
		outcome, reason := eventNoop, AnomalyReason("")
		if r.RefundID == "" || !applied[r.RefundID] {
			outcome, reason = addRefund(p, r)
		}
		if outcome == eventApplied && r.RefundID != "" {
			applied[r.RefundID] = true
		}
		if outcome == eventAnomaly {
			// r as reported: its amount, not what it would have added.
			if err := s.recordAnomaly(ctx, tx, r, p.OrderNo, reason); err != nil {
				return err
			}
			continue
		}
		if err := s.setEventOutcome(ctx, tx, r.Provider, r.EventID, outcome, "", p.OrderNo); err != nil {
			return err
		}
	}
	return nil
}

// addRefund applies refund or total r to settled payment p's facts, whose
// RefundID (if any) no other event applied, and returns what became of it:
// eventApplied, eventNoop (a total at or under the largest reported), or
// eventAnomaly and why. The rule: S, the sum of the distinct refunds, and
// T, the largest total reported, each stay at most the amount paid, and
// the refunded amount R is max(S, T), since a total and the refunds it
// counts tell of the same money.
func addRefund(p *Payment, r PaymentEvent) (string, AnomalyReason) {
	switch {
	case r.OrderNo != "" && r.OrderNo != p.OrderNo:
		return eventAnomaly, AnomalyOrderMismatch
	case r.Currency != p.Currency:
		return eventAnomaly, AnomalyCurrencyMismatch
	}
	if r.Kind == PaymentRefundedTotal {
		switch {
		case r.Amount <= p.RefundedReportedCents:
			return eventNoop, ""
		case r.Amount > p.AmountCents:
			return eventAnomaly, AnomalyRefundExceedsPayment
		}
		p.RefundedReportedCents = r.Amount
	} else {
		if p.RefundedSumCents+r.Amount > p.AmountCents {
			return eventAnomaly, AnomalyRefundExceedsPayment
		}
		p.RefundedSumCents += r.Amount
	}
	p.RefundedCents = max(p.RefundedSumCents, p.RefundedReportedCents)
	p.EventsApplied++
	return eventApplied, ""
}

// refundTold reports whether another event of ev's refund (its RefundID)
// applied or waits. The caller holds the lock of ev's payment, under which
// every event of that payment is written.
func (s Orders) refundTold(ctx context.Context, tx *sql.Tx, ev PaymentEvent) (bool, error) {
	if ev.RefundID == "" {
		return false, nil
	}
	var eventID string
	err := tx.QueryRowContext(ctx, s.Payments.SelectRefundTold, ev.Provider, ev.RefundID, ev.EventID).Scan(&eventID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idempotency: read the refund's events: %w", err)
	}
	return true, nil
}

// applyRefund adds the event to its payment's refunds, or keeps it pending.
func (s Orders) applyRefund(ctx context.Context, tx *sql.Tx, ev PaymentEvent, claim func() error) (PaymentOutcome, string, error) {
	var orderNo sql.NullString
	err := tx.QueryRowContext(ctx, s.Payments.SelectPaymentOrder, ev.Provider, ev.PaymentID).Scan(&orderNo)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return PaymentOutcome{}, "", fmt.Errorf("idempotency: read payment: %w", err)
	}
	if !orderNo.Valid {
		// Not settled, as far as this transaction's snapshot knows: lock
		// the payment row (creating it pending), and only it.
		p, err := s.lockPayment(ctx, tx, ev.Provider, ev.PaymentID, true)
		if err != nil {
			return PaymentOutcome{}, "", err
		}
		if p.Status == PaymentSettled {
			// Its success committed since: taking the order's lock now
			// would invert the lock order.
			return PaymentOutcome{}, "", fmt.Errorf("%w: payment %s of %s was settled while a refund read it", ErrPaymentConflict, ev.PaymentID, ev.Provider)
		}
		if err := claim(); err != nil {
			return PaymentOutcome{}, "", err
		}
		told, err := s.refundTold(ctx, tx, ev)
		if err != nil {
			return PaymentOutcome{}, "", err
		}
		if told {
			// The refund waits already, under another event id.
			return PaymentOutcome{}, eventNoop, nil
		}
		return PaymentOutcome{Pending: true}, eventPending, nil
	}

	o, err := s.lockOrder(ctx, tx, orderNo.String)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	p, err := s.lockPayment(ctx, tx, ev.Provider, ev.PaymentID, false)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	if err := claim(); err != nil {
		return PaymentOutcome{}, "", err
	}
	told, err := s.refundTold(ctx, tx, ev)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	outcome, reason := eventNoop, AnomalyReason("")
	if !told {
		read := p.EventsApplied
		outcome, reason = addRefund(&p, ev)
		if outcome == eventApplied {
			if err := s.exec(ctx, tx, "refund payment", s.Payments.UpdatePaymentRefund,
				p.RefundedCents, p.RefundedSumCents, p.RefundedReportedCents, p.EventsApplied,
				p.Provider, p.PaymentID, read); err != nil {
				return PaymentOutcome{}, "", err
			}
		}
	}
	if outcome == eventAnomaly {
		return PaymentOutcome{OrderNo: p.OrderNo, Status: o.status, Anomaly: reason}, eventAnomaly, nil
	}
	f := orderFacts{paid: true, amount: p.AmountCents, refunded: p.RefundedCents, cancel: o.cancel()}
	status := o.status
	if outcome == eventApplied {
		if status, err = s.moveOrder(ctx, tx, o, f); err != nil {
			return PaymentOutcome{}, "", err
		}
	}
	out := s.outcome(p.OrderNo, status, f)
	out.Applied = outcome == eventApplied
	return out, outcome, nil
}

// outcome reports an order's state and the refund its facts owe.
func (s Orders) outcome(orderNo string, status OrderStatus, f orderFacts) PaymentOutcome {
	out := PaymentOutcome{OrderNo: orderNo, Status: status}
	if f.refundOwed() > 0 {
		out.Anomaly = AnomalyRefundOwed
	}
	return out
}

// RequestCancel records the user's cancel request (the fact C) inside tx
// and moves the order to the state its facts derive: an unpaid order is
// CANCELED; a paid one is CANCELED and owes a refund (ListAnomalies lists
// it as AnomalyRefundOwed) unless it is refunded in full, which stays
// REFUNDED. A second request changes nothing. It returns the order's state,
// ErrOrderNotFound, or ErrPaymentConflict (transient: retry).
func (s Orders) RequestCancel(ctx context.Context, tx *sql.Tx, orderNo string) (OrderStatus, error) {
	status, err := s.requestCancel(ctx, tx, orderNo)
	return status, conflicted(err)
}

func (s Orders) requestCancel(ctx context.Context, tx *sql.Tx, orderNo string) (OrderStatus, error) {
	o, err := s.lockOrder(ctx, tx, orderNo)
	if err != nil {
		return "", err
	}
	pays, err := s.settledPayments(ctx, tx, orderNo)
	if err != nil {
		return "", err
	}
	f := orderFacts{cancel: true}
	if len(pays) > 0 {
		f.paid, f.amount, f.refunded = true, pays[0].AmountCents, pays[0].RefundedCents
	}
	return s.moveOrder(ctx, tx, o, f)
}

// lockOrder locks an order row and reads its facts.
func (s Orders) lockOrder(ctx context.Context, tx *sql.Tx, orderNo string) (lockedOrder, error) {
	o := lockedOrder{orderNo: orderNo}
	var status string
	err := tx.QueryRowContext(ctx, s.Payments.LockOrder, orderNo).Scan(&status, &o.flag, &o.total, &o.currency)
	if errors.Is(err, sql.ErrNoRows) {
		return o, fmt.Errorf("%w: %s", ErrOrderNotFound, orderNo)
	}
	if err != nil {
		return o, fmt.Errorf("idempotency: lock order: %w", err)
	}
	o.status = OrderStatus(status)
	return o, nil
}

// moveOrder writes the state f derives, and the cancel fact, guarded by
// the state o was read in.
func (s Orders) moveOrder(ctx context.Context, tx *sql.Tx, o lockedOrder, f orderFacts) (OrderStatus, error) {
	to := f.status()
	if to == o.status && f.cancel == o.flag {
		return to, nil
	}
	if to != o.status && !CanTransition(o.status, to) {
		return "", &TransitionError{OrderNo: o.orderNo, From: o.status, To: to, Actual: o.status}
	}
	res, err := tx.ExecContext(ctx, s.Payments.UpdateOrderFacts, string(to), f.cancel, o.orderNo, string(o.status))
	if err != nil {
		return "", fmt.Errorf("idempotency: move order: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return "", fmt.Errorf("idempotency: move order: %w", err)
	}
	if n != 1 {
		return "", fmt.Errorf("%w: order %s is no longer %s", ErrPaymentConflict, o.orderNo, o.status)
	}
	return to, nil
}

// lockPayment locks a payment row, creating it pending first if create.
func (s Orders) lockPayment(ctx context.Context, tx *sql.Tx, provider, paymentID string, create bool) (Payment, error) {
	if create {
		if _, err := tx.ExecContext(ctx, s.Payments.InsertPendingPayment, provider, paymentID); err != nil {
			return Payment{}, fmt.Errorf("idempotency: create pending payment: %w", err)
		}
	}
	return s.scanPayment(tx.QueryRowContext(ctx, s.Payments.LockPayment, provider, paymentID), provider, paymentID)
}

// GetPayment reads the facts of one provider payment.
func (s Orders) GetPayment(ctx context.Context, q Queryer, provider, paymentID string) (*Payment, error) {
	p, err := s.scanPayment(q.QueryRowContext(ctx, s.Payments.SelectPayment, provider, paymentID), provider, paymentID)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

func (s Orders) scanPayment(row *sql.Row, provider, paymentID string) (Payment, error) {
	p := Payment{Provider: provider, PaymentID: paymentID}
	var orderNo, currency sql.NullString
	var amount sql.NullInt64
	var status string
	err := row.Scan(&orderNo, &status, &amount, &currency, &p.RefundedCents, &p.RefundedSumCents, &p.RefundedReportedCents, &p.EventsApplied)
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("%w: %s of %s", ErrPaymentNotFound, paymentID, provider)
	}
	if err != nil {
		return p, fmt.Errorf("idempotency: read payment: %w", err)
	}
	p.OrderNo, p.Status, p.AmountCents, p.Currency = orderNo.String, PaymentStatus(status), amount.Int64, currency.String
	return p, nil
}

// settledPayments reads an order's settled payments (at most one: a second
// is AnomalyDoublePayment) with a shared lock.
func (s Orders) settledPayments(ctx context.Context, tx *sql.Tx, orderNo string) ([]Payment, error) {
	rows, err := tx.QueryContext(ctx, s.Payments.SelectOrderPayments, orderNo)
	if err != nil {
		return nil, fmt.Errorf("idempotency: read order payments: %w", err)
	}
	defer rows.Close()
	var out []Payment
	for rows.Next() {
		p := Payment{OrderNo: orderNo, Status: PaymentSettled}
		if err := rows.Scan(&p.Provider, &p.PaymentID, &p.AmountCents, &p.RefundedCents); err != nil {
			return nil, fmt.Errorf("idempotency: read order payments: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotency: read order payments: %w", err)
	}
	return out, nil
}

// recordAnomaly marks ev's row ANOMALY and records the anomaly.
func (s Orders) recordAnomaly(ctx context.Context, tx *sql.Tx, ev PaymentEvent, orderNo string, reason AnomalyReason) error {
	if err := s.setEventOutcome(ctx, tx, ev.Provider, ev.EventID, eventAnomaly, reason, orderNo); err != nil {
		return err
	}
	return s.insertAnomaly(ctx, tx, ev, orderNo, reason)
}

func (s Orders) insertAnomaly(ctx context.Context, tx *sql.Tx, ev PaymentEvent, orderNo string, reason AnomalyReason) error {
	if orderNo == "" {
		orderNo = ev.OrderNo
	}
	_, err := tx.ExecContext(ctx, s.Payments.InsertAnomaly, ev.Provider, ev.EventID, string(ev.Kind), ev.PaymentID,
		nullable(orderNo), ev.Amount, ev.Currency, ev.Digest, string(reason))
	if err != nil {
		return fmt.Errorf("idempotency: record payment anomaly: %w", err)
	}
	return nil
}

// setEventOutcome records what became of an event; orderNo fills the
// event's order when the event named none.
func (s Orders) setEventOutcome(ctx context.Context, tx *sql.Tx, provider, eventID, outcome string, reason AnomalyReason, orderNo string) error {
	_, err := tx.ExecContext(ctx, s.Payments.UpdateEventOutcome, outcome, nullable(string(reason)), nullable(orderNo), provider, eventID)
	if err != nil {
		return fmt.Errorf("idempotency: record payment event outcome: %w", err)
	}
	return nil
}

// exec runs a guarded write that must change exactly one row.
func (s Orders) exec(ctx context.Context, tx *sql.Tx, what, query string, args ...any) error {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("idempotency: %s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idempotency: %s: %w", what, err)
	}
	if n != 1 {
		return fmt.Errorf("%w: %s matched %d rows", ErrPaymentConflict, what, n)
	}
	return nil
}

// RowsQueryer is what ListAnomalies reads through: *sql.DB, *sql.Tx or
// *sql.Conn.
type RowsQueryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// ListAnomalies returns up to limit anomalies, newest first: the events
// recorded as unable to apply, and the refunds owed by canceled orders that
// were paid (AnomalyRefundOwed, derived from the facts: it leaves the list
// once the refunds cover the payment). A limit of zero or less means 100.
func (s Orders) ListAnomalies(ctx context.Context, q RowsQueryer, limit int) ([]PaymentAnomaly, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := q.QueryContext(ctx, s.Payments.ListAnomalies, limit)
	if err != nil {
		return nil, fmt.Errorf("idempotency: list payment anomalies: %w", err)
	}
	defer rows.Close()
	var out []PaymentAnomaly
	for rows.Next() {
		var a PaymentAnomaly
		var reason, kind string
		var orderNo sql.NullString
		var at dbTime
		if err := rows.Scan(&reason, &a.Provider, &a.EventID, &kind, &a.PaymentID, &orderNo,
			&a.AmountCents, &a.Currency, &a.Digest, &at); err != nil {
			return nil, fmt.Errorf("idempotency: list payment anomalies: %w", err)
		}
		a.Reason, a.Kind, a.OrderNo, a.At = AnomalyReason(reason), PaymentKind(kind), orderNo.String, at.Time
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotency: list payment anomalies: %w", err)
	}
	return out, nil
}
