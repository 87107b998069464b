package orderservice

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

// Recover is the example's idempotency.RecoverFunc, the seed's background
// check: an abandoned create attempt took effect if purchase_order has a row
// with the record's scope and key created in the record's period, at or after
// rec.CreatedAt. The rebuilt snapshot is the 201 the original would have
// answered.
//
// An older row belongs to an earlier period of the key: a key reused after
// its retention is taken over and its created_at starts again. Finishing the
// renewed attempt with that row would replay another request's answer,
// perhaps for another body. So it counts as not found and the key is
// released; the retry executes, meets UNIQUE (scope, idempotency_key) and
// answers 409 duplicate-order.
func (s *Service) Recover(ctx context.Context, rec *idempotency.Record) (*idempotency.Snapshot, bool, error) {
	var orderNo string
	var createdAt orderTime
	err := s.db.QueryRowContext(ctx, s.sql.orderByKey, rec.Scope, rec.Key).Scan(&orderNo, &createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !createdAt.notBefore(rec.CreatedAt) {
		return nil, false, nil
	}
	order, err := s.sql.orders.Get(ctx, s.db, orderNo)
	if err != nil {
		return nil, false, err
	}
	order.Status = idempotency.OrderCreated // the answer to the create, whatever happened since
	body, err := json.Marshal(toResponse(order))
	if err != nil {
		return nil, false, err
	}
	return &idempotency.Snapshot{
		StatusCode: http.StatusCreated,
		Header:     http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/" + orderNo}},
		Body:       append(body, '\n'),
	}, true, nil
}

// orderTime is purchase_order.created_at as read, with the resolution it is
// stored at: MySQL's DATETIME(6) and PostgreSQL's timestamptz keep
// microseconds, SQLite's
// CURRENT_TIMESTAMP text whole seconds. It comes from the database's clock,
// like the record's created_at, and is read the way the store reads its
// times (a driver time.Time in UTC, text as UTC), so the two compare without
// the application's clock. This assumes the service and the store share the
// database handle, as they do here.
type orderTime struct {
	at         time.Time
	resolution time.Duration
}

// Scan implements sql.Scanner.
func (t *orderTime) Scan(v any) error {
	switch v := v.(type) {
	case time.Time:
		t.at, t.resolution = v.UTC(), time.Microsecond
		return nil
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	default:
		return fmt.Errorf("orderservice: cannot scan %T as purchase_order.created_at", v)
	}
}

func (t *orderTime) parse(s string) error {
	at, err := time.Parse("2006-01-02 15:04:05.999999", s)
	if err != nil {
		return fmt.Errorf("orderservice: purchase_order.created_at %q: %w", s, err)
	}
	t.at, t.resolution = at, time.Second
	if strings.Contains(s, ".") {
		t.resolution = time.Microsecond
	}
	return nil
}

// notBefore reports whether the order was created at or after periodStart,
// compared at the order time's resolution: an order stamped 12:00:00 may have
// been written at 12:00:00.9, after a claim at 12:00:00.5. The tolerance
// never admits an order of an earlier period, which is older than the
// takeover by at least that period's retention (Config enforces Retention ≥
// Lease ≥ 1s).
func (t orderTime) notBefore(periodStart time.Time) bool {
	return !t.at.Before(periodStart.Truncate(t.resolution))
}
