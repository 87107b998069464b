package idempotency

import (
	"crypto/sha256"
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
//     (created PENDING if absent). The first success of a CREATED order
//     claims its event after the order's lock and inserts its payment
//     settled (the row is new, so no refund waits for it); an insert that
//     meets the row, which a refund created, takes the path above
//     (applySuccess);
//   - the event's row (unique (provider, event_id)) is inserted after those
//     locks and before any other write, with the outcome known by then
//     (rewritten only if it turns out another): a second delivery of the
//     same event waits for the first, finds the id taken and writes
//     nothing more. So
//     every refund's event row is written under its payment's lock (a
//     success's, on the short path, under its order's), and a success that reads the refunds waiting for its payment
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
