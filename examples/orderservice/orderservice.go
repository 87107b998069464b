// Package orderservice is the example order API: create, read, cancel and
// pay orders over MySQL, SQLite or PostgreSQL, with every write protected by the
// idempotency middleware. The example server, the benchmarks and the tests
// all serve these handlers.
//
// Contract:
//
//	POST /orders                   create (Idempotency-Key required)  201, 4xx
//	GET  /orders/{order_no}        read (owner only, else 404)        200, 404
//	POST /orders/{order_no}/cancel CREATED|PAID → CANCELED (key)      200, 409
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
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/payment"
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
	// "postgres", as given to Setup. Defaults to "sqlite" when the
	// database answers SELECT sqlite_version(), else "mysql": the payment
	// state machine's locking reads (the cancel, the webhooks) are not
	// SQL that SQLite runs.
	Dialect string

	// Config is the base middleware configuration; Route and Operation
	// are set per route (CreateOperation and the others).
	Config idempotency.Config

	// PaymentEventsMode, when set, records payment events in that mode
	// instead of single-phase. Defaults to single-phase, whatever
	// Config.Mode says: the payment state machine writes only in the
	// record's transaction, so a lease protects nothing there, and
	// single-phase commits once (the benchmarks' webhook family measures
	// both).
	PaymentEventsMode *idempotency.Mode

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
	db         *sql.DB
	opts       Options
	sql        statements
	mux        *http.ServeMux
	middleware map[string]*idempotency.Middleware // by route, with Idempotency
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
	// refundedCents reads the refunded amount of an order's settled
	// payment (the first, as Orders.RequestCancel takes it; a second is
	// an anomaly). Parameter: order_no.
	refundedCents string
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
		refundedCents:  `SELECT refunded_cents FROM order_payment WHERE order_no = ? AND status = 'SUCCEEDED' ORDER BY provider, payment_id LIMIT 1`,
		seedSKU:        `INSERT IGNORE INTO sku (id, name, price_cents) VALUES (?, ?, ?)`,
		seedCoupon:     `INSERT IGNORE INTO coupon (id, discount_cents, status) VALUES (?, ?, 'AVAILABLE')`,
	},
	"sqlite": {
		orders:         idempotency.SQLiteOrders,
		skuPrice:       `SELECT price_cents FROM sku WHERE id = ?`,
		redeemCoupon:   `UPDATE coupon SET status = 'REDEEMED', updated_at = CURRENT_TIMESTAMP WHERE id = ? AND status = 'AVAILABLE'`,
		couponDiscount: `SELECT discount_cents FROM coupon WHERE id = ?`,
		orderByKey:     `SELECT order_no, created_at FROM purchase_order WHERE scope = ? AND idempotency_key = ?`,
		refundedCents:  `SELECT refunded_cents FROM order_payment WHERE order_no = ? AND status = 'SUCCEEDED' ORDER BY provider, payment_id LIMIT 1`,
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
		refundedCents:  `SELECT refunded_cents FROM order_payment WHERE order_no = $1 AND status = 'SUCCEEDED' ORDER BY provider, payment_id LIMIT 1`,
		seedSKU:        `INSERT INTO sku (id, name, price_cents) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		seedCoupon:     `INSERT INTO coupon (id, discount_cents, status) VALUES ($1, $2, 'AVAILABLE') ON CONFLICT DO NOTHING`,
	},
}

// defaultDialect is Options.Dialect's default: "sqlite" when db is
// SQLite, which only SQLite answers sqlite_version(), else "mysql".
func defaultDialect(db *sql.DB) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var version string
	if db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version) == nil {
		return "sqlite"
	}
	return "mysql"
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
	if opts.Dialect == "" {
		opts.Dialect = defaultDialect(db)
	}
	st, err := dialectStatements(opts.Dialect)
	if err != nil {
		return nil, err
	}
	s := &Service{db: db, opts: opts, sql: st, mux: http.NewServeMux(), middleware: map[string]*idempotency.Middleware{}}
	create, err := s.protect(CreateOperation, s.createOrder)
	if err != nil {
		return nil, err
	}
	cancel, err := s.protect(CancelOperation, s.cancelOrder)
	if err != nil {
		return nil, err
	}
	pay, err := s.protect(PayOperation, s.transition(idempotency.OrderCreated, idempotency.OrderPaid))
	if err != nil {
		return nil, err
	}
	if opts.Idempotency {
		// Payment events: the fingerprint is the event's payload digest,
		// given by payment.ActionOf to Do; no route of the service.
		cfg := s.opts.Config
		cfg.Route = PaymentEvents
		cfg.Mode = idempotency.ModeSinglePhase
		if opts.PaymentEventsMode != nil {
			cfg.Mode = *opts.PaymentEventsMode
		}
		if cfg.Mode == idempotency.ModeSinglePhase && cfg.InFlightWait == 0 {
			// Two copies of one event at once (a provider's retry
			// storm): the second waits for the first on this instance
			// and replays it, rather than applying beside it, waiting on
			// the order's lock and rolling back. No longer than the lock
			// wait it would have had.
			cfg.InFlightWait = 5 * time.Second
		}
		if _, ok := s.opts.Store.(idempotency.TxOptionsBeginner); ok && s.opts.Dialect == "mysql" && cfg.TxOptions == nil {
			// At REPEATABLE READ the events of different orders lock
			// the index gaps beside each other's rows and deadlock
			// (Config.TxOptions).
			cfg.TxOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		}
		mw, err := idempotency.New(s.opts.Store, &cfg)
		if err != nil {
			return nil, err
		}
		s.middleware[PaymentEvents] = mw
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

// Middleware returns the idempotency middleware of a protected route
// ("create_order", "cancel_order", "pay_order"), or nil without
// Options.Idempotency. Front-ends of other transports (gRPC, queue
// consumers) protect the same action with it: one replay cache, one route
// in the metrics, and one action per key whatever transport carries it.
func (s *Service) Middleware(route string) *idempotency.Middleware { return s.middleware[route] }

// txHandler is a write handler over HTTP: it runs inside tx and returns its
// reply; the caller commits on 2xx and rolls back otherwise.
type txHandler func(ctx context.Context, tx *sql.Tx, r *http.Request) Reply

// createOrder is POST /orders over Create.
func (s *Service) createOrder(ctx context.Context, tx *sql.Tx, r *http.Request) Reply {
	var req CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return Reply{Problem: idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body", err.Error())}
	}
	uid, _ := userID(r)
	return s.Create(ctx, tx, uid, req)
}

// cancelOrder is POST /orders/{order_no}/cancel over Cancel.
func (s *Service) cancelOrder(ctx context.Context, tx *sql.Tx, r *http.Request) Reply {
	uid, _ := userID(r)
	return s.Cancel(ctx, tx, uid, r.PathValue("order_no"))
}

// transition is POST /orders/{order_no}/pay over Transition.
func (s *Service) transition(from, to idempotency.OrderStatus) txHandler {
	return func(ctx context.Context, tx *sql.Tx, r *http.Request) Reply {
		uid, _ := userID(r)
		return s.Transition(ctx, tx, uid, r.PathValue("order_no"), from, to)
	}
}

// getOrder is GET /orders/{order_no} over Get.
func (s *Service) getOrder(w http.ResponseWriter, r *http.Request) {
	uid, _ := userID(r)
	s.Get(r.Context(), uid, r.PathValue("order_no")).Write(w)
}

// protect wraps a write handler with the idempotency middleware, or, with
// idempotency off, with a plain transaction per request.
func (s *Service) protect(op idempotency.Operation, h txHandler) (http.Handler, error) {
	if !s.opts.Idempotency {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.Unprotected(r.Context(), func(tx *sql.Tx) Reply { return h(r.Context(), tx, r) }).Write(w)
		}), nil
	}
	cfg := s.opts.Config
	cfg.Route = op.Name
	cfg.Operation = &op
	cfg.ScopeFunc = principalScope
	mw, err := idempotency.New(s.opts.Store, &cfg)
	if err != nil {
		return nil, err
	}
	s.middleware[op.Name] = mw
	return mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		h(r.Context(), tx, r).Write(w)
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
		if _, p := Principal(r); p != nil {
			idempotency.WriteProblem(w, p)
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

// validateCreate refuses malformed create requests before the middleware
// claims a key, so bad input writes nothing: a body that is not a create
// request is 400, a user_id that is not the caller's is 403.
func validateCreate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := CheckCreate(w, r); p != nil {
			idempotency.WriteProblem(w, p)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CheckCreate is POST /orders's check before the middleware claims a key,
// for any framework's handler in front of it: the body read through a 64
// KiB limit (413 body-too-large), decoded as a create request (400
// invalid-body) and checked against the principal (ValidateCreate). On
// success r.Body is the body again, from its start, and it returns nil.
func CheckCreate(w http.ResponseWriter, r *http.Request) *idempotency.Problem {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return idempotency.NewProblem(http.StatusRequestEntityTooLarge,
				idempotency.ProblemBodyTooLarge, "Request body too large", err.Error())
		}
		return invalidBody(err.Error())
	}
	var req CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return invalidBody("body must be a JSON object {user_id, sku_id, quantity, coupon_id?}: " + err.Error())
	}
	uid, _ := userID(r)
	if p := ValidateCreate(uid, req); p != nil {
		return p
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return nil
}

// CreateFromHTTP is POST /orders inside the middleware, for any framework's
// handler: the create request decoded from r's body and created by Create in
// the record's transaction (idempotency.TxFromContext), for r's principal.
func (s *Service) CreateFromHTTP(r *http.Request) Reply {
	tx, ok := idempotency.TxFromContext(r.Context())
	if !ok {
		return failure(idempotency.ErrNoTransaction)
	}
	return s.createOrder(r.Context(), tx, r)
}

// CancelFromHTTP is POST /orders/{order_no}/cancel inside the middleware,
// for any framework's handler: the order orderNo (the framework's path
// parameter) canceled by Cancel in the record's transaction, for r's
// principal.
func (s *Service) CancelFromHTTP(r *http.Request, orderNo string) Reply {
	tx, ok := idempotency.TxFromContext(r.Context())
	if !ok {
		return failure(idempotency.ErrNoTransaction)
	}
	uid, _ := userID(r)
	return s.Cancel(r.Context(), tx, uid, orderNo)
}

// PaymentEvents is the name of the Middleware (Service.Middleware) that
// records payment providers' events: one for every provider and every path
// an event arrives by (a webhook, a queue), each event an action under its
// provider's scope and its own id (payment.ActionOf).
const PaymentEvents = "payment_events"

// PaymentWebhook serves one provider's callbacks (v verifies them) on the
// order state machine of the service's database: payment.Webhook with the
// PaymentEvents Middleware. It needs the service's idempotency.
func (s *Service) PaymentWebhook(v payment.Verifier, observe func(payment.Observation)) (*payment.Webhook, error) {
	mw := s.middleware[PaymentEvents]
	if mw == nil {
		return nil, errors.New("orderservice: payment webhooks need Options.Idempotency")
	}
	return payment.NewWebhook(payment.Config{Verifier: v, Middleware: mw, Orders: s.sql.orders, DB: s.db, Observe: observe,
		Logger: s.opts.Config.Logger})
}

// PaymentOrders is the order store's SQL in the service's dialect, payments
// included: what a consumer of payment events applies them with
// (payment.Apply).
func (s *Service) PaymentOrders() idempotency.Orders { return s.sql.orders }

// Principal returns the request's principal (X-User-ID, a positive
// integer), or the 401 problem to answer.
func Principal(r *http.Request) (int64, *idempotency.Problem) {
	uid, err := userID(r)
	if err != nil {
		return 0, idempotency.NewProblem(http.StatusUnauthorized,
			idempotency.ProblemScopeRequired, "Unauthenticated", "Send X-User-ID: a positive integer.")
	}
	return uid, nil
}

func internalError(w http.ResponseWriter, err error) {
	idempotency.WriteProblem(w, failure(err).Problem)
}

func invalidBody(detail string) *idempotency.Problem {
	return idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body", detail)
}
