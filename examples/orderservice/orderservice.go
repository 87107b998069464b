// Package orderservice is the example order API: create, read, cancel and
// pay orders over MySQL, SQLite or PostgreSQL, with every write protected by the
// idempotency middleware. The example server, the benchmarks and the tests
// all serve these handlers.
//
// Contract:
//
//	POST /orders                   create (Idempotency-Key required)  201, 4xx
//	GET  /orders/{order_no}        read (owner only, else 404)        200, 404
//	POST /orders/{order_no}/cancel CREATED → CANCELED (key required)  200, 409
//	POST /orders/{order_no}/pay    CREATED → PAID (key required)      200, 409
//	GET  /healthz                                                     200
//
// X-User-ID stands in for authentication: it is required (401), its value
// parsed as a positive decimal integer is the principal, and the principal in
// canonical decimal is the scope of every idempotency key, so "7", "+7" and
// "007" are one user with one key space.
//
// A database failure that a retry can overcome (idempotency.IsTransient:
// deadlock, lock wait timeout, dropped connection) answers 503
// store-unavailable with Retry-After; any other server error answers 500.
package orderservice

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
)

// Catalog facts the seed data establishes.
const (
	FirstSKU            = 20001
	LastSKU             = 20100
	FirstCoupon         = 1
	LastCoupon          = 1000
	CouponDiscountCents = 500
)

// SKUPriceCents is the seeded price of a catalog SKU.
func SKUPriceCents(sku int64) int64 { return 1000 + (sku-FirstSKU)*25 }

// Problem kinds of this service, beside the middleware's.
const (
	ProblemInvalidTransition = "invalid-transition"
	ProblemForbidden         = "forbidden"
	ProblemNotFound          = "not-found"
	ProblemUnknownSKU        = "unknown-sku"
	ProblemInvalidQuantity   = "invalid-quantity"
	ProblemCouponUnavailable = "coupon-unavailable"
)

// Options configure the service.
type Options struct {
	// Idempotency wraps the write handlers with the middleware. When false
	// every request runs in its own transaction, unprotected: the baseline
	// for benchmarks and simulations.
	Idempotency bool

	// Store is the idempotency store (required when Idempotency is set).
	Store idempotency.Store

	// Dialect is the SQL dialect of the database: "mysql", "sqlite" or
	// "postgres", as given to Setup. Defaults to "mysql", whose statements
	// SQLite runs too.
	Dialect string

	// Config is the base middleware configuration; Route and Fingerprint
	// are set per route.
	Config idempotency.Config

	// HandlerDelay is an artificial delay inside the create transaction.
	HandlerDelay time.Duration

	// AfterCreate, when set, runs inside the create transaction after the
	// order row is written; an error fails the request like a database error
	// there would: 503 if idempotency.IsTransient, else 500. The example
	// server and the tests use it for fault injection.
	AfterCreate func(ctx context.Context) error
}

// Service serves the order API.
type Service struct {
	db   *sql.DB
	opts Options
	sql  statements
	mux  *http.ServeMux
}

// statements is the service's SQL in one dialect, written by hand: the
// order state machine's and the catalog's.
type statements struct {
	orders idempotency.Orders
	// skuPrice reads sku.price_cents. Parameter: sku id.
	skuPrice string
	// redeemCoupon moves an AVAILABLE coupon to REDEEMED. Parameter: coupon id.
	redeemCoupon string
	// couponDiscount reads coupon.discount_cents. Parameter: coupon id.
	couponDiscount string
	// orderByKey reads the order_no and created_at of the order for a scope
	// and key. Parameters: scope, key.
	orderByKey string
	// seedSKU and seedCoupon insert a catalog row unless it exists.
	// Parameters: id, name, price_cents; id, discount_cents.
	seedSKU, seedCoupon string
}

var dialects = map[string]statements{
	"mysql": {
		orders:         idempotency.MySQLOrders,
		skuPrice:       `SELECT price_cents FROM sku WHERE id = ?`,
		redeemCoupon:   `UPDATE coupon SET status = 'REDEEMED', updated_at = CURRENT_TIMESTAMP WHERE id = ? AND status = 'AVAILABLE'`,
		couponDiscount: `SELECT discount_cents FROM coupon WHERE id = ?`,
		orderByKey:     `SELECT order_no, created_at FROM purchase_order WHERE scope = ? AND idempotency_key = ?`,
		seedSKU:        `INSERT IGNORE INTO sku (id, name, price_cents) VALUES (?, ?, ?)`,
		seedCoupon:     `INSERT IGNORE INTO coupon (id, discount_cents, status) VALUES (?, ?, 'AVAILABLE')`,
	},
	"sqlite": {
		orders:         idempotency.MySQLOrders,
		skuPrice:       `SELECT price_cents FROM sku WHERE id = ?`,
		redeemCoupon:   `UPDATE coupon SET status = 'REDEEMED', updated_at = CURRENT_TIMESTAMP WHERE id = ? AND status = 'AVAILABLE'`,
		couponDiscount: `SELECT discount_cents FROM coupon WHERE id = ?`,
		orderByKey:     `SELECT order_no, created_at FROM purchase_order WHERE scope = ? AND idempotency_key = ?`,
		seedSKU:        `INSERT OR IGNORE INTO sku (id, name, price_cents) VALUES (?, ?, ?)`,
		seedCoupon:     `INSERT OR IGNORE INTO coupon (id, discount_cents, status) VALUES (?, ?, 'AVAILABLE')`,
	},
	// Times by clock_timestamp(), the statement's clock (now() is the
	// transaction's start), like the store's.
	"postgres": {
		orders:         idempotency.PostgresOrders,
		skuPrice:       `SELECT price_cents FROM sku WHERE id = $1`,
		redeemCoupon:   `UPDATE coupon SET status = 'REDEEMED', updated_at = clock_timestamp() WHERE id = $1 AND status = 'AVAILABLE'`,
		couponDiscount: `SELECT discount_cents FROM coupon WHERE id = $1`,
		orderByKey:     `SELECT order_no, created_at FROM purchase_order WHERE scope = $1 AND idempotency_key = $2`,
		seedSKU:        `INSERT INTO sku (id, name, price_cents) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		seedCoupon:     `INSERT INTO coupon (id, discount_cents, status) VALUES ($1, $2, 'AVAILABLE') ON CONFLICT DO NOTHING`,
	},
}

// dialectStatements returns the statements of dialect ("" is "mysql").
func dialectStatements(dialect string) (statements, error) {
	if dialect == "" {
		dialect = "mysql"
	}
	st, ok := dialects[dialect]
	if !ok {
		return statements{}, fmt.Errorf("orderservice: unknown dialect %q: want mysql, sqlite or postgres", dialect)
	}
	return st, nil
}

// New returns the service over db, whose schema Setup has prepared.
func New(db *sql.DB, opts Options) (*Service, error) {
	st, err := dialectStatements(opts.Dialect)
	if err != nil {
		return nil, err
	}
	s := &Service{db: db, opts: opts, sql: st, mux: http.NewServeMux()}
	create, err := s.protect("create_order", idempotency.FingerprintConfig{
		// The seed's whitelist DTO: only what changes the order counts.
		Fields: []string{"user_id", "sku_id", "quantity", "coupon_id"},
	}, s.createOrder)
	if err != nil {
		return nil, err
	}
	cancel, err := s.protect("cancel_order", idempotency.FingerprintConfig{}, s.transition(idempotency.OrderCreated, idempotency.OrderCanceled))
	if err != nil {
		return nil, err
	}
	pay, err := s.protect("pay_order", idempotency.FingerprintConfig{}, s.transition(idempotency.OrderCreated, idempotency.OrderPaid))
	if err != nil {
		return nil, err
	}
	s.mux.Handle("POST /orders", s.authenticated(validateCreate(create)))
	s.mux.Handle("GET /orders/{order_no}", s.authenticated(http.HandlerFunc(s.getOrder)))
	s.mux.Handle("POST /orders/{order_no}/cancel", s.authenticated(cancel))
	s.mux.Handle("POST /orders/{order_no}/pay", s.authenticated(pay))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// txHandler is a write handler: it runs inside tx and returns its answer;
// the caller commits on 2xx and rolls back otherwise.
type txHandler func(ctx context.Context, tx *sql.Tx, r *http.Request) answer

type answer struct {
	status  int
	header  http.Header
	body    any
	problem *idempotency.Problem
}

func (a answer) write(w http.ResponseWriter) {
	if a.problem != nil {
		idempotency.WriteProblem(w, a.problem)
		return
	}
	for k, v := range a.header {
		w.Header()[k] = v
	}
	writeJSON(w, a.status, a.body)
}

// protect wraps a write handler with the idempotency middleware, or, with
// idempotency off, with a plain transaction per request.
func (s *Service) protect(route string, fp idempotency.FingerprintConfig, h txHandler) (http.Handler, error) {
	if !s.opts.Idempotency {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := s.db.BeginTx(r.Context(), nil)
			if err != nil {
				internalError(w, err)
				return
			}
			a := h(r.Context(), tx, r)
			if a.problem == nil && a.status >= 200 && a.status < 300 {
				if err := tx.Commit(); err != nil {
					idempotency.WriteProblem(w, commitFailure(err))
					return
				}
			} else {
				_ = tx.Rollback()
			}
			a.write(w)
		}), nil
	}
	cfg := s.opts.Config
	cfg.Route = route
	cfg.Fingerprint = fp
	cfg.ScopeFunc = principalScope
	mw, err := idempotency.New(s.opts.Store, &cfg)
	if err != nil {
		return nil, err
	}
	return mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		h(r.Context(), tx, r).write(w)
	})), nil
}

// authenticated requires X-User-ID, a positive integer standing in for an
// authenticated principal.
//
// Every spelling strconv.ParseInt accepts ("7", "+7", "007") is accepted as
// the same user: the header stands in for a verified credential, and what the
// idempotency protocol needs is that the principal, not its spelling, owns the
// key (principalScope). Refusing non-canonical spellings would be a stricter
// input policy, not a fix: the scope must be canonical either way.
func (s *Service) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := userID(r); err != nil {
			idempotency.WriteProblem(w, idempotency.NewProblem(http.StatusUnauthorized,
				idempotency.ProblemScopeRequired, "Unauthenticated", "Send X-User-ID: a positive integer."))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// principalScope is the ScopeFunc of every protected route: the principal
// in canonical decimal, never the raw header. Scoping by the raw header let
// "7", "+7" and "007" hold three claims on one key and create three orders
// for user 7.
func principalScope(r *http.Request) (string, error) {
	id, err := userID(r)
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(id, 10), nil
}

func userID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.Header.Get("X-User-ID"), 10, 64)
	if err != nil || id <= 0 {
		return 0, errors.New("invalid X-User-ID")
	}
	return id, nil
}

// CreateRequest is the body of POST /orders. Only the first four fields are
// the order; OrderNo lets a client propose the order number (the weak guard
// the simulation compares against) and is not part of the fingerprint.
type CreateRequest struct {
	UserID   int64  `json:"user_id"`
	SKUID    int64  `json:"sku_id"`
	Quantity int    `json:"quantity"`
	CouponID *int64 `json:"coupon_id,omitempty"`
	OrderNo  string `json:"order_no,omitempty"`
}

// OrderResponse is the body of a created or read order.
type OrderResponse struct {
	OrderNo        string `json:"order_no"`
	Status         string `json:"status"`
	UserID         int64  `json:"user_id"`
	SKUID          int64  `json:"sku_id"`
	Quantity       int    `json:"quantity"`
	CouponID       *int64 `json:"coupon_id"`
	UnitPriceCents int64  `json:"unit_price_cents"`
	DiscountCents  int64  `json:"discount_cents"`
	TotalCents     int64  `json:"total_cents"`
}

var orderNoPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validateCreate refuses malformed create requests before the middleware
// claims a key, so bad input writes nothing: a body that is not a create
// request is 400, a user_id that is not the caller's is 403.
func validateCreate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				idempotency.WriteProblem(w, idempotency.NewProblem(http.StatusRequestEntityTooLarge,
					idempotency.ProblemBodyTooLarge, "Request body too large", err.Error()))
				return
			}
			badRequest(w, err.Error())
			return
		}
		var req CreateRequest
		if err := json.Unmarshal(body, &req); err != nil {
			badRequest(w, "body must be a JSON object {user_id, sku_id, quantity, coupon_id?}: "+err.Error())
			return
		}
		if req.OrderNo != "" && !orderNoPattern.MatchString(req.OrderNo) {
			badRequest(w, "order_no must be 1-64 characters of A-Z a-z 0-9 _ -")
			return
		}
		if uid, _ := userID(r); req.UserID != uid {
			idempotency.WriteProblem(w, idempotency.NewProblem(http.StatusForbidden, ProblemForbidden,
				"Forbidden", "user_id must equal X-User-ID"))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// createOrder prices the order from the catalog (never from the client),
// redeems the coupon with a guarded transition and inserts the order INIT →
// CREATED, all in tx.
func (s *Service) createOrder(ctx context.Context, tx *sql.Tx, r *http.Request) answer {
	var req CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return answer{problem: idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body", err.Error())}
	}
	if req.Quantity < 1 || req.Quantity > 100 {
		return unprocessable(ProblemInvalidQuantity, "Invalid quantity", "quantity must be 1-100")
	}
	var unitPrice int64
	err := tx.QueryRowContext(ctx, s.sql.skuPrice, req.SKUID).Scan(&unitPrice)
	if errors.Is(err, sql.ErrNoRows) {
		return unprocessable(ProblemUnknownSKU, "Unknown SKU", fmt.Sprintf("sku_id %d is not in the catalog", req.SKUID))
	}
	if err != nil {
		return failure(err)
	}
	subtotal := unitPrice * int64(req.Quantity)
	var discount int64
	if req.CouponID != nil {
		res, err := tx.ExecContext(ctx, s.sql.redeemCoupon, *req.CouponID)
		if err != nil {
			return failure(err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return failure(err)
		} else if n != 1 {
			return unprocessable(ProblemCouponUnavailable, "Coupon unavailable",
				fmt.Sprintf("coupon %d is unknown or already used", *req.CouponID))
		}
		if err := tx.QueryRowContext(ctx, s.sql.couponDiscount, *req.CouponID).Scan(&discount); err != nil {
			return failure(err)
		}
		discount = min(discount, subtotal)
	}

	scope, key, _ := idempotency.KeyFromContext(ctx)
	order := &idempotency.Order{
		OrderNo: req.OrderNo, Scope: scope, IdempotencyKey: key,
		UserID: req.UserID, SKUID: req.SKUID, Quantity: req.Quantity, CouponID: req.CouponID,
		UnitPriceCents: unitPrice, DiscountCents: discount, TotalCents: subtotal - discount,
	}
	if order.OrderNo == "" {
		order.OrderNo = newOrderNo()
	}
	if err := s.sql.orders.Create(ctx, tx, order); err != nil {
		if errors.Is(err, idempotency.ErrDuplicateOrder) {
			return answer{problem: idempotency.NewProblem(http.StatusConflict, "duplicate-order", "Duplicate order",
				"An order with this order number or idempotency key already exists.")}
		}
		return failure(err)
	}
	if s.opts.AfterCreate != nil {
		if err := s.opts.AfterCreate(ctx); err != nil {
			return failure(err)
		}
	}
	if s.opts.HandlerDelay > 0 {
		select {
		case <-time.After(s.opts.HandlerDelay):
		case <-ctx.Done():
			return failure(ctx.Err())
		}
	}
	return answer{
		status: http.StatusCreated,
		header: http.Header{"Location": {"/orders/" + order.OrderNo}},
		body:   toResponse(order),
	}
}

// transition returns the handler of a guarded order state change.
func (s *Service) transition(from, to idempotency.OrderStatus) txHandler {
	return func(ctx context.Context, tx *sql.Tx, r *http.Request) answer {
		order, err := s.sql.orders.Get(ctx, tx, r.PathValue("order_no"))
		uid, _ := userID(r)
		if errors.Is(err, idempotency.ErrOrderNotFound) || (err == nil && order.UserID != uid) {
			return answer{problem: notFound()}
		}
		if err != nil {
			return failure(err)
		}
		err = s.sql.orders.Transition(ctx, tx, order.OrderNo, from, to)
		var te *idempotency.TransitionError
		if errors.As(err, &te) {
			return answer{problem: idempotency.NewProblem(http.StatusConflict, ProblemInvalidTransition,
				"Invalid transition", fmt.Sprintf("order %s is %s; only a %s order can become %s", order.OrderNo, te.Actual, from, to))}
		}
		if err != nil {
			return failure(err)
		}
		order.Status = to
		return answer{status: http.StatusOK, body: toResponse(order)}
	}
}

func (s *Service) getOrder(w http.ResponseWriter, r *http.Request) {
	order, err := s.sql.orders.Get(r.Context(), s.db, r.PathValue("order_no"))
	uid, _ := userID(r)
	if errors.Is(err, idempotency.ErrOrderNotFound) || (err == nil && order.UserID != uid) {
		idempotency.WriteProblem(w, notFound())
		return
	}
	if err != nil {
		idempotency.WriteProblem(w, serverProblem(err, "The database failed for a moment. Retry the read."))
		return
	}
	writeJSON(w, http.StatusOK, toResponse(order))
}

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

func toResponse(o *idempotency.Order) OrderResponse {
	return OrderResponse{
		OrderNo: o.OrderNo, Status: string(o.Status), UserID: o.UserID, SKUID: o.SKUID,
		Quantity: o.Quantity, CouponID: o.CouponID, UnitPriceCents: o.UnitPriceCents,
		DiscountCents: o.DiscountCents, TotalCents: o.TotalCents,
	}
}

func newOrderNo() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "O" + time.Now().UTC().Format("20060102") + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		internalError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func unprocessable(kind, title, detail string) answer {
	return answer{problem: idempotency.NewProblem(http.StatusUnprocessableEntity, kind, title, detail)}
}

// failure is a server-side error of a write handler. The middleware treats
// every 5xx as not final: the transaction rolls back, the key is released and
// a retry executes again. So a transient error is 503 with Retry-After (the
// retry will likely succeed, and clients and proxies know to make it), and
// anything else 500 (a bug, which a retry would likely meet again).
func failure(err error) answer {
	return answer{problem: serverProblem(err,
		"The database failed for a moment; nothing was recorded. Retry with the same key.")}
}

// serverProblem classifies err: 503 store-unavailable with Retry-After and
// transientDetail when idempotency.IsTransient, else 500 execution-failed.
func serverProblem(err error, transientDetail string) *idempotency.Problem {
	if idempotency.IsTransient(err) {
		p := idempotency.NewProblem(http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable,
			"Database unavailable", transientDetail)
		p.RetryAfter = 1
		return p
	}
	return idempotency.NewProblem(http.StatusInternalServerError,
		idempotency.ProblemExecutionFailed, "Internal error", err.Error())
}

// commitFailure answers a failed COMMIT of the unprotected baseline. Unlike
// any earlier failure it cannot say "nothing was recorded": a connection
// lost during COMMIT leaves the outcome unknown, and without the middleware
// nothing finds it out.
func commitFailure(err error) *idempotency.Problem {
	if idempotency.IsTransient(err) {
		p := idempotency.NewProblem(http.StatusServiceUnavailable, idempotency.ProblemCommitUnknown, "Outcome unknown",
			"The database failed during commit; the write may or may not have taken effect. This route is unprotected: a retry may apply it twice.")
		p.RetryAfter = 1
		return p
	}
	return idempotency.NewProblem(http.StatusInternalServerError,
		idempotency.ProblemExecutionFailed, "Internal error", "commit: "+err.Error())
}

func internalError(w http.ResponseWriter, err error) {
	idempotency.WriteProblem(w, failure(err).problem)
}

func badRequest(w http.ResponseWriter, detail string) {
	idempotency.WriteProblem(w, idempotency.NewProblem(http.StatusBadRequest,
		idempotency.ProblemInvalidBody, "Invalid request body", detail))
}

func notFound() *idempotency.Problem {
	return idempotency.NewProblem(http.StatusNotFound, ProblemNotFound, "Not found", "No such order for this user.")
}

//go:embed schema/*.sql
var schema embed.FS

// Setup applies the idempotency migrations of dialect ("mysql", "sqlite" or
// "postgres"), creates the catalog tables and seeds SKUs 20001–20100 and
// coupons 1–1000. It is safe to call on every start. The "postgres"
// migrations are registered by the postgres module: a program that calls
// Setup with it imports github.com/orderguard/idempotency/postgres.
func Setup(ctx context.Context, db *sql.DB, dialect string) error {
	st, err := dialectStatements(dialect)
	if err != nil {
		return err
	}
	if err := migrations.Apply(ctx, db, dialect); err != nil {
		return err
	}
	script, err := schema.ReadFile("schema/" + dialect + ".sql")
	if err != nil {
		return fmt.Errorf("orderservice: unknown dialect %q", dialect)
	}
	for _, stmt := range migrations.Statements(string(script)) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("orderservice: schema: %w", err)
		}
	}
	// A restart finds the catalog seeded: one query instead of 1,100
	// inserts that would change nothing (a seed never resets a row).
	var skus, coupons int64
	if err := db.QueryRowContext(ctx, fmt.Sprintf(
		"SELECT (SELECT COUNT(*) FROM sku WHERE id BETWEEN %d AND %d), (SELECT COUNT(*) FROM coupon WHERE id BETWEEN %d AND %d)",
		FirstSKU, LastSKU, FirstCoupon, LastCoupon)).Scan(&skus, &coupons); err != nil {
		return fmt.Errorf("orderservice: count catalog: %w", err)
	}
	if skus == LastSKU-FirstSKU+1 && coupons == LastCoupon-FirstCoupon+1 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	for id := int64(FirstSKU); id <= LastSKU; id++ {
		if _, err := tx.ExecContext(ctx, st.seedSKU, id, fmt.Sprintf("SKU %d", id), SKUPriceCents(id)); err != nil {
			return fmt.Errorf("orderservice: seed sku: %w", err)
		}
	}
	for id := int64(FirstCoupon); id <= LastCoupon; id++ {
		if _, err := tx.ExecContext(ctx, st.seedCoupon, id, CouponDiscountCents); err != nil {
			return fmt.Errorf("orderservice: seed coupon: %w", err)
		}
	}
	return tx.Commit()
}
