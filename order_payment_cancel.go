package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The user's cancel request, the row locks every path takes, and the
// reads of the facts (payments, anomalies).

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
