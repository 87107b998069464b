package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency/payment"
)

// naiveWebhook is the usual deduplicating webhook handler, for comparison:
// it verifies the signature as the library's does, then
//
//  1. SELECT processed_events WHERE id (its own transaction);
//  2. if absent: apply the effect (its own transaction);
//  3. INSERT processed_events (its own transaction; no unique constraint).
//
// Two deliveries of one event that both pass 1 before either reaches 3
// both apply it. barrier makes that interleaving certain for the pairs the
// simulator sends at once, instead of hoping the scheduler produces it.
type naiveWebhook struct {
	db        *sql.DB
	dialect   string
	verifiers map[string]payment.Verifier // by route path
	barrier   *pairBarrier
}

// naiveSchema is the naive handler's tables: the processed events, without
// a unique constraint, and the log of every effect applied (one row per
// application, so that a second application of an event is counted).
var naiveSchema = []string{
	`CREATE TABLE IF NOT EXISTS naive_processed_event (provider VARCHAR(32) NOT NULL, event_id VARCHAR(255) NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS naive_effect (provider VARCHAR(32) NOT NULL, event_id VARCHAR(255) NOT NULL,
  kind VARCHAR(16) NOT NULL, order_no VARCHAR(64) NOT NULL, payment_id VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL)`,
}

func setupNaive(ctx context.Context, db *sql.DB) error {
	for _, stmt := range naiveSchema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("naive schema: %w", err)
		}
	}
	return nil
}

func (h *naiveWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v := h.verifiers[r.URL.Path]
	body, err := io.ReadAll(io.LimitReader(r.Body, payment.MaxBodyBytes+1))
	if err != nil {
		v.Refuse(w, http.StatusBadRequest, "unreadable body")
		return
	}
	ev, err := v.Verify(r.Header, body, time.Now())
	if err != nil {
		v.Refuse(w, http.StatusBadRequest, "not verified")
		return
	}
	if ev.Kind == payment.Ignored {
		v.Acknowledge(w)
		return
	}
	ctx := r.Context()
	// 1. Look up.
	var seen int
	if err := h.db.QueryRowContext(ctx, h.q(`SELECT COUNT(*) FROM naive_processed_event WHERE provider = ? AND event_id = ?`),
		ev.Provider, ev.ID).Scan(&seen); err != nil {
		v.Refuse(w, http.StatusServiceUnavailable, "database")
		return
	}
	if seen > 0 {
		v.Acknowledge(w)
		return
	}
	h.barrier.pass(ctx, ev.Provider+"/"+ev.ID)
	// 2. Apply.
	if err := h.apply(ctx, ev); err != nil {
		v.Refuse(w, http.StatusServiceUnavailable, "database")
		return
	}
	// 3. Remember.
	if _, err := h.db.ExecContext(ctx, h.q(`INSERT INTO naive_processed_event (provider, event_id) VALUES (?, ?)`), ev.Provider, ev.ID); err != nil {
		v.Refuse(w, http.StatusServiceUnavailable, "database")
		return
	}
	v.Acknowledge(w)
}

// apply logs the effect and moves the order: PAID on a success, REFUNDED
// once the logged refunds cover its total.
func (h *naiveWebhook) apply(ctx context.Context, ev payment.Event) error {
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	kind := string(kindSuccess)
	if ev.Kind == payment.Refunded {
		kind = string(kindRefund)
	}
	if _, err := tx.ExecContext(ctx, h.q(`INSERT INTO naive_effect (provider, event_id, kind, order_no, payment_id, amount_cents) VALUES (?, ?, ?, ?, ?, ?)`),
		ev.Provider, ev.ID, kind, ev.OrderNo, ev.PaymentID, ev.Amount); err != nil {
		return err
	}
	switch ev.Kind {
	case payment.Succeeded:
		_, err = tx.ExecContext(ctx, h.q(`UPDATE purchase_order SET status = 'PAID' WHERE order_no = ? AND status = 'CREATED'`), ev.OrderNo)
	case payment.Refunded:
		// The refunds so far, by a plain read (no locks): the usual code,
		// and it keeps the naive handler's own deadlocks out of the count.
		var refunded int64
		if err := tx.QueryRowContext(ctx, h.q(`SELECT COALESCE(SUM(amount_cents), 0) FROM naive_effect WHERE order_no = ? AND kind = 'refund'`),
			ev.OrderNo).Scan(&refunded); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, h.q(`UPDATE purchase_order SET status = 'REFUNDED' WHERE order_no = ? AND status IN ('PAID', 'CANCELED') AND total_cents <= ?`),
			ev.OrderNo, refunded)
	}
	if err != nil {
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

// pairBarrier holds the first of two deliveries announced as concurrent,
// after its look-up, until the second has looked up too: both then find
// the event absent. Deliveries of events not announced pass straight
// through, as does every delivery after the pair met.
type pairBarrier struct {
	mu      sync.Mutex
	met     map[string]chan struct{}
	arrived map[string]int
}

func newPairBarrier() *pairBarrier {
	return &pairBarrier{met: map[string]chan struct{}{}, arrived: map[string]int{}}
}

// expect announces two deliveries of key.
func (b *pairBarrier) expect(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.met[key]; !ok {
		b.met[key] = make(chan struct{})
	}
}

// pass returns once both announced deliveries of key have arrived, or ctx
// ends (the caller went away).
func (b *pairBarrier) pass(ctx context.Context, key string) {
	b.mu.Lock()
	ch, ok := b.met[key]
	if ok {
		b.arrived[key]++
		if b.arrived[key] == 2 {
			close(ch)
		}
	}
	b.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}
