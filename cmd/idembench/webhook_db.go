package main

// The webhook family at the database: the run's orders, the effects its
// events had, the protected webhooks' deadlocks, and the naive twin.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/payment"
)

// naiveWebhook is the webhook family's unprotected twin, the usual
// deduplicating handler (examples/paysim's -naive): the same verifier,
// then
//
//  1. SELECT the processed events for the event's id (its own statement);
//  2. if absent, apply the effect: log it and pay the order (a transaction);
//  3. INSERT the event id into the processed events (no unique constraint).
//
// Two deliveries of one event that both pass 1 before either reaches 3
// both apply it: the effect log counts the applications.
type naiveWebhook struct {
	db      *sql.DB
	dialect string
	v       payment.Verifier
}

// newNaiveWebhook creates the twin's tables on db.
func newNaiveWebhook(ctx context.Context, db *sql.DB, dialect string, v payment.Verifier) (*naiveWebhook, error) {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS naive_processed_event (provider VARCHAR(32) NOT NULL, event_id VARCHAR(255) NOT NULL)`,
		`CREATE INDEX naive_processed_event_id ON naive_processed_event (provider, event_id)`,
		`CREATE TABLE IF NOT EXISTS naive_effect (provider VARCHAR(32) NOT NULL, event_id VARCHAR(255) NOT NULL,
  order_no VARCHAR(64) NOT NULL, amount_cents BIGINT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("naive webhook schema: %w", err)
		}
	}
	return &naiveWebhook{db: db, dialect: dialect, v: v}, nil
}

func (h *naiveWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ev, ok := verified(w, r, h.v)
	if !ok {
		return
	}
	ctx := r.Context()
	var seen int
	if err := h.db.QueryRowContext(ctx, h.q(`SELECT COUNT(*) FROM naive_processed_event WHERE provider = ? AND event_id = ?`),
		ev.Provider, ev.ID).Scan(&seen); err != nil {
		h.v.Refuse(w, http.StatusServiceUnavailable, "database")
		return
	}
	if seen == 0 {
		if err := h.apply(ctx, ev); err != nil {
			h.v.Refuse(w, http.StatusServiceUnavailable, "database")
			return
		}
		if _, err := h.db.ExecContext(ctx, h.q(`INSERT INTO naive_processed_event (provider, event_id) VALUES (?, ?)`), ev.Provider, ev.ID); err != nil {
			h.v.Refuse(w, http.StatusServiceUnavailable, "database")
			return
		}
	}
	h.v.Acknowledge(w)
}

// apply logs the effect and pays the order.
func (h *naiveWebhook) apply(ctx context.Context, ev payment.Event) error {
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, h.q(`INSERT INTO naive_effect (provider, event_id, order_no, amount_cents) VALUES (?, ?, ?, ?)`),
		ev.Provider, ev.ID, ev.OrderNo, ev.Amount); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, h.q(`UPDATE purchase_order SET status = 'PAID' WHERE order_no = ? AND status = 'CREATED'`), ev.OrderNo); err != nil {
		return err
	}
	return tx.Commit()
}

// q writes ? placeholders as $n for PostgreSQL.
func (h *naiveWebhook) q(query string) string {
	if h.dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// verified reads r's body and verifies it with v, as both twins do before
// anything else; it answers r itself when it reports false.
func verified(w http.ResponseWriter, r *http.Request, v payment.Verifier) (payment.Event, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, payment.MaxBodyBytes+1))
	if err != nil {
		v.Refuse(w, http.StatusBadRequest, "unreadable body")
		return payment.Event{}, false
	}
	ev, err := v.Verify(r.Header, body, time.Now())
	if err != nil {
		v.Refuse(w, http.StatusBadRequest, "not verified")
		return payment.Event{}, false
	}
	return ev, true
}

// machineWebhook is the webhook family's other twin: the protected
// webhook's work without its idempotency record. The same verifier, then
// the order store's payment state machine (Orders.ApplyPayment, which
// records each event id itself) in a plain transaction at the isolation
// level the protected webhook uses, committed, acknowledged. Its ratio to
// the naive handler is what the payment facts cost; the protected
// variants' ratio to it is what the record costs.
type machineWebhook struct {
	db     *sql.DB
	orders idempotency.Orders
	tx     *sql.TxOptions
	v      payment.Verifier
}

func (h *machineWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ev, ok := verified(w, r, h.v)
	if !ok {
		return
	}
	if err := h.apply(r.Context(), ev); err != nil {
		h.v.Refuse(w, http.StatusServiceUnavailable, "database")
		return
	}
	h.v.Acknowledge(w)
}

func (h *machineWebhook) apply(ctx context.Context, ev payment.Event) error {
	tx, err := h.db.BeginTx(ctx, h.tx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	kind := idempotency.PaymentSucceeded // the family delivers successes only
	if ev.Kind != payment.Succeeded {
		return fmt.Errorf("machine webhook: %s events are not delivered by this benchmark", ev.Kind)
	}
	if _, err := h.orders.ApplyPayment(ctx, tx, idempotency.PaymentEvent{
		Provider: ev.Provider, EventID: ev.ID, PaymentID: ev.PaymentID, OrderNo: ev.OrderNo,
		Kind: kind, Amount: ev.Amount, Currency: ev.Currency, Digest: ev.Digest,
	}); err != nil {
		return err
	}
	return tx.Commit()
}

// createOrders creates the run's orders, CREATED, one per event, and
// returns the events that pay them.
func (wb *webhookBed) createOrders(ctx context.Context, run string, n int) ([]webhookEvent, error) {
	const total = 1000
	at := time.Now().UTC().Format(time.RFC3339)
	events := make([]webhookEvent, n)
	const batch = 500
	for from := 0; from < n; from += batch {
		tx, err := wb.f.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		for i := from; i < min(from+batch, n); i++ {
			o := &idempotency.Order{OrderNo: fmt.Sprintf("WH%s-%d", run, i), Scope: "webhook", UserID: int64(i%users + 1),
				SKUID: firstSKU, Quantity: 1, UnitPriceCents: total, TotalCents: total, Currency: idempotency.DefaultCurrency}
			if err := wb.orders.Create(ctx, tx, o); err != nil {
				_ = tx.Rollback()
				return nil, fmt.Errorf("create order: %w", err)
			}
			events[i] = webhookEvent{id: fmt.Sprintf("evt_%s_%d", run, i), body: fmt.Appendf(nil,
				`{"type":"payment.succeeded","timestamp":%q,"data":{"order_no":%q,"payment_id":"pay_%s_%d","amount":%d,"currency":%q}}`,
				at, o.OrderNo, run, i, total, o.Currency)}
		}
		if err := tx.Commit(); err != nil {
			return nil, err
		}
	}
	return events, nil
}

// count reads what the run's events did: the orders paid, and the effects
// beyond one per event (the naive handler's effect log; the protected
// store's payments, each of which applies one event per success).
func (wb *webhookBed) count(ctx context.Context, run string, protected bool) (paid, doubles int, err error) {
	db := wb.f.db
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM purchase_order WHERE order_no LIKE 'WH`+run+`-%' AND status = 'PAID'`).Scan(&paid); err != nil {
		return 0, 0, err
	}
	q := `SELECT COUNT(*) - COUNT(DISTINCT event_id) FROM naive_effect WHERE event_id LIKE 'evt_` + run + `_%'`
	if protected {
		q = `SELECT COALESCE(SUM(events_applied - 1), 0) FROM order_payment WHERE payment_id LIKE 'pay_` + run + `_%' AND events_applied > 1`
	}
	if err := db.QueryRowContext(ctx, q).Scan(&doubles); err != nil {
		return 0, 0, err
	}
	return paid, doubles, nil
}

// deadlockCounter is a slog.Handler for the protected webhooks' log: it
// counts the lines whose error is a deadlock (MySQL's 1213, PostgreSQL's
// 40P01), each an event answered 503 and delivered again.
type deadlockCounter struct{ n atomic.Int64 }

func (c *deadlockCounter) Enabled(context.Context, slog.Level) bool { return true }

func (c *deadlockCounter) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" && strings.Contains(strings.ToLower(a.Value.String()), "deadlock") {
			c.n.Add(1)
			return false
		}
		return true
	})
	return nil
}

func (c *deadlockCounter) WithAttrs([]slog.Attr) slog.Handler { return c }

func (c *deadlockCounter) WithGroup(string) slog.Handler { return c }
