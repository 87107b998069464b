package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Applying a provider event: a success, a refund, a reported total (see
// order_payment.go for the facts and the lock protocol).

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
	// The event's row is inserted with the outcome the path knows when it
	// claims (orderNo fills the row's order when ev names none), so that
	// the common paths need no second write of it: only an outcome that
	// differs from the claimed one, or an order the row lacks, is written
	// again below.
	var claimed, claimedOrder string
	claim := func(outcome, orderNo string) error {
		if claimed != "" {
			return nil
		}
		if ev.OrderNo != "" {
			orderNo = ev.OrderNo
		}
		ok, err := s.claimEvent(ctx, tx, ev, outcome, orderNo)
		if err == nil && !ok {
			return errDuplicateEvent
		}
		if err == nil {
			claimed, claimedOrder = outcome, orderNo
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
	if outcome == claimed && (claimedOrder != "" || out.OrderNo == "") {
		return out, nil // the row says it already
	}
	return out, s.setEventOutcome(ctx, tx, ev.Provider, ev.EventID, outcome, "", out.OrderNo)
}

// errDuplicateEvent stops an event whose id is recorded before it writes
// anything but what its first delivery wrote too.
var errDuplicateEvent = errors.New("idempotency: payment event recorded before")

// claimEvent inserts the event's row with outcome and orderNo, or reports
// that its id is taken.
func (s Orders) claimEvent(ctx context.Context, tx *sql.Tx, ev PaymentEvent, outcome, orderNo string) (bool, error) {
	res, err := tx.ExecContext(ctx, s.Payments.InsertEvent,
		ev.Provider, ev.EventID, string(ev.Kind), ev.PaymentID, nullable(ev.RefundID), nullable(orderNo),
		ev.Amount, ev.Currency, ev.Digest, outcome)
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
//
// The first success of a CREATED order, the common event, takes a shorter
// path: LockOrder, InsertEvent (APPLIED), InsertSettledPayment and
// UpdateOrderFacts, four statements. A CREATED order has no settled
// payment (one would have made it PAID), so under the order's lock the
// success settles its payment unless the payment's row exists: a refund
// that waits for the payment creates the row PENDING, under the row's
// lock, before it writes its event, and a success of another order that
// names the payment settles it. With no row there is no refund to apply
// and no settled payment to repeat, so the payment is inserted settled at
// once, without reading the row first (the insert meets a row whatever
// committed before it or is being written, which a read at READ COMMITTED
// could miss) and without the pending refunds' read. An insert that meets
// the row writes no fact and the success takes the locking path as it
// would have: the row is committed by then (or its writer's transaction
// is in this one's snapshot's future, which REPEATABLE READ reports as a
// conflict), and the event's row, claimed APPLIED, gets its outcome
// rewritten if it is another.
//
// On that path the event's row is claimed before the payment's row is
// written, the lock order being order, event, payment: only an event of
// the same id that names the same payment could wait the other way, a
// refund reusing a success's event id, and a deadlock between the two is
// rolled back and reported as ErrPaymentConflict.
func (s Orders) applySuccess(ctx context.Context, tx *sql.Tx, ev PaymentEvent, claim func(outcome, orderNo string) error) (PaymentOutcome, string, error) {
	anomaly := func(o *lockedOrder, reason AnomalyReason) (PaymentOutcome, string, error) {
		if err := claim(eventAnomaly, ""); err != nil {
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
	settled := Payment{Provider: ev.Provider, PaymentID: ev.PaymentID, OrderNo: ev.OrderNo, Status: PaymentSettled,
		AmountCents: ev.Amount, Currency: ev.Currency, EventsApplied: 1}
	exists := false // InsertSettledPayment met the payment's row
	if o.status == OrderCreated && s.Payments.InsertSettledPayment != "" {
		if err := claim(eventApplied, ""); err != nil {
			return PaymentOutcome{}, "", err
		}
		inserted, err := s.insertSettledPayment(ctx, tx, settled)
		if err != nil {
			return PaymentOutcome{}, "", err
		}
		if inserted {
			return s.settled(ctx, tx, o, settled)
		}
		exists = true
	}
	p, err := s.lockPayment(ctx, tx, ev.Provider, ev.PaymentID, !exists)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	if p.Status == PaymentSettled {
		// The same payment's success again, under another event id.
		switch {
		case p.OrderNo != ev.OrderNo:
			return anomaly(&o, AnomalyOrderMismatch)
		case p.AmountCents != ev.Amount:
			return anomaly(&o, AnomalyAmountMismatch)
		case p.Currency != ev.Currency:
			return anomaly(&o, AnomalyCurrencyMismatch)
		}
		if err := claim(eventNoop, ""); err != nil {
			return PaymentOutcome{}, "", err
		}
		f := orderFacts{paid: true, amount: p.AmountCents, refunded: p.RefundedCents, cancel: o.cancel()}
		return s.outcome(ev.OrderNo, o.status, f), eventNoop, nil
	}
	// Another payment of the order: none while it is CREATED, its state
	// derived from its facts under its lock (a settled payment makes it
	// PAID, REFUNDED or CANCELED), so the common first success reads
	// nothing more.
	if o.status != OrderCreated {
		others, err := s.settledPayments(ctx, tx, ev.OrderNo)
		if err != nil {
			return PaymentOutcome{}, "", err
		}
		if len(others) > 0 {
			return anomaly(&o, AnomalyDoublePayment)
		}
	}
	if err := claim(eventApplied, ""); err != nil {
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
	return s.settled(ctx, tx, o, p)
}

// settled moves o to the state its settled payment p derives.
func (s Orders) settled(ctx context.Context, tx *sql.Tx, o lockedOrder, p Payment) (PaymentOutcome, string, error) {
	f := orderFacts{paid: true, amount: p.AmountCents, refunded: p.RefundedCents, cancel: o.cancel()}
	status, err := s.moveOrder(ctx, tx, o, f)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	out := s.outcome(p.OrderNo, status, f)
	out.Applied = true
	return out, eventApplied, nil
}

// insertSettledPayment inserts p, settled by its success alone, and
// reports whether it did: false when p's row exists, which it then leaves
// as it was but for its updated_at on MySQL (see InsertSettledPayment).
func (s Orders) insertSettledPayment(ctx context.Context, tx *sql.Tx, p Payment) (bool, error) {
	res, err := tx.ExecContext(ctx, s.Payments.InsertSettledPayment, p.Provider, p.PaymentID, p.OrderNo, p.AmountCents, p.Currency)
	if err != nil {
		return false, fmt.Errorf("idempotency: insert settled payment: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idempotency: insert settled payment: %w", err)
	}
	return n == 1, nil
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
// What becomes of it is decided under the payment's lock before its row is
// claimed (reads only: other events of its refund, the payment's facts),
// so that the row is inserted with its outcome and its payment's order.
func (s Orders) applyRefund(ctx context.Context, tx *sql.Tx, ev PaymentEvent, claim func(outcome, orderNo string) error) (PaymentOutcome, string, error) {
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
		told, err := s.refundTold(ctx, tx, ev)
		if err != nil {
			return PaymentOutcome{}, "", err
		}
		if told {
			// The refund waits already, under another event id.
			return PaymentOutcome{}, eventNoop, claim(eventNoop, "")
		}
		return PaymentOutcome{Pending: true}, eventPending, claim(eventPending, "")
	}

	o, err := s.lockOrder(ctx, tx, orderNo.String)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	p, err := s.lockPayment(ctx, tx, ev.Provider, ev.PaymentID, false)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	told, err := s.refundTold(ctx, tx, ev)
	if err != nil {
		return PaymentOutcome{}, "", err
	}
	read := p.EventsApplied
	outcome, reason := eventNoop, AnomalyReason("")
	if !told {
		outcome, reason = addRefund(&p, ev)
	}
	if err := claim(outcome, p.OrderNo); err != nil {
		return PaymentOutcome{}, "", err
	}
	if outcome == eventApplied {
		if err := s.exec(ctx, tx, "refund payment", s.Payments.UpdatePaymentRefund,
			p.RefundedCents, p.RefundedSumCents, p.RefundedReportedCents, p.EventsApplied,
			p.Provider, p.PaymentID, read); err != nil {
			return PaymentOutcome{}, "", err
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
