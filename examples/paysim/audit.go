package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// readOrders reads every order back (GET /orders/{no}), counts the states
// and compares each with the state the acknowledged facts make it: the
// order store derives the state from its facts (a payment settled, the
// refunded amount, a cancel), so an order whose answers were all certain
// must be in exactly that state.
//
// Where the server shows an order's refunded amount (refunded_cents), an
// amount above the distinct refunds sent is a double application: the
// count of a server whose database the simulator cannot read.
func (r *runner) readOrders(ctx context.Context, res *Result) error {
	byGET, doubles := true, 0
	for _, no := range r.orderNos {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.t.URL+"/orders/"+no, nil)
		req.Header.Set("X-User-ID", strconv.FormatInt(r.orderOwner[no], 10))
		resp, err := r.http.Do(req)
		if err != nil {
			return fmt.Errorf("GET /orders/%s: %w", no, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var o struct {
			orderservice.OrderResponse
			// RefundedCents is set by a server that shows the order's
			// payment state (orderservice.OrderView).
			RefundedCents *int64 `json:"refunded_cents"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &o) != nil {
			return fmt.Errorf("GET /orders/%s: %d %s", no, resp.StatusCode, strings.TrimSpace(string(raw)))
		}
		res.States[o.Status]++
		if o.RefundedCents == nil {
			byGET = false
		}
		f := r.facts[no]
		if r.t.naive != nil {
			// The naive handler keeps no payment facts: its row is about
			// double applications only.
			continue
		}
		if o.RefundedCents != nil && *o.RefundedCents > f.refundsSent {
			// More refunded than the distinct refunds sent: one was
			// applied twice.
			doubles++
		}
		switch {
		case f.unknown:
			res.Unknown++
		case o.Status != string(f.expected()):
			res.Unexpected++
		case o.RefundedCents != nil && f.paid && *o.RefundedCents != f.refunded:
			res.Unexpected++
		}
	}
	if byGET && r.t.naive == nil {
		res.Counted, res.DoubleApplications = "GET /orders", doubles
	}
	return nil
}

// expected is the state of an order with these facts, as the order store
// derives it (order_payment.go).
func (f *facts) expected() idempotency.OrderStatus {
	switch {
	case f.paid && f.refunded >= f.total:
		return idempotency.OrderRefunded
	case f.cancel:
		return idempotency.OrderCanceled
	case f.paid:
		return idempotency.OrderPaid
	}
	return idempotency.OrderCreated
}

// count reads the target's database: double applications, forgeries that
// took effect, and the anomalies recorded.
func (r *runner) count(ctx context.Context, res *Result) error {
	res.Counted = "database"
	applied := map[string]bool{} // forged ids found applied
	if r.t.naive != nil {
		if err := r.countNaive(ctx, res, applied); err != nil {
			return err
		}
	} else if err := r.countProtected(ctx, res, applied); err != nil {
		return err
	}
	for id := range r.forgedOK {
		applied[id] = true
	}
	res.ForgeriesAccepted = len(applied)
	return nil
}

// countProtected is the detector for the order store. A payment's row
// (order_payment) counts the events applied to it and the money refunded;
// the simulator knows which distinct genuine events it sent for the
// payment. A payment with more events applied than distinct events sent,
// or more refunded than the distinct refunds sent, had an event applied
// twice. Both bounds hold for any delivery order and any subset of events
// applied, so a correct server never trips them. An event id recorded
// twice in payment_event, and a forged id recorded at all, are counted
// too.
func (r *runner) countProtected(ctx context.Context, res *Result, forgedApplied map[string]bool) error {
	rows, err := r.t.DB.QueryContext(ctx, `SELECT provider, payment_id, events_applied, refunded_cents FROM order_payment`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var provider, paymentID string
		var eventsApplied int
		var refunded int64
		if err := rows.Scan(&provider, &paymentID, &eventsApplied, &refunded); err != nil {
			return err
		}
		tr := r.payments[provider+"/"+paymentID]
		if tr == nil {
			continue // another run's, or another client's
		}
		d := max(0, eventsApplied-len(tr.events))
		if d == 0 && refunded > tr.refunds {
			d = 1
		}
		res.DoubleApplications += d
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := r.eventRows(ctx, `SELECT provider, event_id, COUNT(*) FROM payment_event GROUP BY provider, event_id`, res, forgedApplied); err != nil {
		return err
	}
	anomalies, err := r.t.Orders.ListAnomalies(ctx, r.t.DB, 100000)
	if err != nil {
		return err
	}
	res.Anomalies = map[string]int{}
	for _, a := range anomalies {
		if _, ours := r.facts[a.OrderNo]; ours || strings.Contains(a.EventID, r.run) {
			res.Anomalies[string(a.Reason)]++
		}
	}
	return nil
}

// countNaive is the detector for the naive handler: its effect log has one
// row per application, so every row beyond an event's first is a double
// application.
func (r *runner) countNaive(ctx context.Context, res *Result, forgedApplied map[string]bool) error {
	return r.eventRows(ctx, `SELECT provider, event_id, COUNT(*) FROM naive_effect GROUP BY provider, event_id`, res, forgedApplied)
}

// eventRows adds, for this run's events, the rows beyond the first of an
// event id as double applications, and notes forged ids applied.
func (r *runner) eventRows(ctx context.Context, query string, res *Result, forgedApplied map[string]bool) error {
	rows, err := r.t.DB.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var provider, id string
		var n int
		if err := rows.Scan(&provider, &id, &n); err != nil {
			return err
		}
		if !strings.Contains(id, r.run) {
			continue
		}
		if r.forgedIDs[id] {
			forgedApplied[id] = true
		}
		res.DoubleApplications += n - 1
	}
	return rows.Err()
}
