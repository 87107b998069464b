package orderservice

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	"github.com/orderguard/idempotency"
)

// The service's operations, free of any transport: the HTTP handlers
// (orderservice.go), the gRPC server and the queue consumer all call them
// and translate the Reply.

// CreateFields is the create action's fingerprint allow-list, the seed's
// whitelist DTO: only what changes the order counts.
var CreateFields = []string{"user_id", "sku_id", "quantity", "coupon_id"}

// The service's actions, each declared once: the HTTP routes, the gRPC
// methods and the queue consumers share the Middleware that carries it, so
// one key is one action whichever transport carries it.
var (
	// CreateOperation is POST /orders: the order's fields (CreateFields),
	// answered 201.
	CreateOperation = idempotency.Operation{Name: "create_order", Route: "POST /orders", Fields: CreateFields, Status: http.StatusCreated}
	// CancelOperation is POST /orders/{order_no}/cancel: the order number
	// is the action (a gRPC CancelOrder's order_no, a message's).
	CancelOperation = idempotency.Operation{Name: "cancel_order", Route: "POST /orders/{order_no}/cancel"}
	// PayOperation is POST /orders/{order_no}/pay.
	PayOperation = idempotency.Operation{Name: "pay_order", Route: "POST /orders/{order_no}/pay"}
)

// Reply is the answer of an operation: an HTTP status with an order, or a
// problem. Other transports map the status and problem kind to their own.
type Reply struct {
	Status int
	Header http.Header
	Order  *OrderResponse
	// View, when set, is what the HTTP answer carries instead of Order:
	// the order with its payment state (Get's reply). Other transports
	// answer Order.
	View    *OrderView
	Problem *idempotency.Problem
}

// Body returns the reply as the HTTP answer carries it: the order as JSON
// (with a final newline) or the problem as application/problem+json.
func (r Reply) Body() (contentType string, body []byte) {
	if r.Problem != nil {
		b, _ := json.Marshal(r.Problem)
		return "application/problem+json", b
	}
	var b []byte
	if r.View != nil {
		b, _ = json.Marshal(r.View)
	} else {
		b, _ = json.Marshal(r.Order)
	}
	return "application/json", append(b, '\n')
}

// StatusCode is the HTTP status of the reply.
func (r Reply) StatusCode() int {
	if r.Problem != nil {
		return r.Problem.Status
	}
	return r.Status
}

// Write writes the reply as the HTTP answer.
func (r Reply) Write(w http.ResponseWriter) {
	if r.Problem != nil {
		idempotency.WriteProblem(w, r.Problem)
		return
	}
	for k, v := range r.Header {
		w.Header()[k] = v
	}
	_, body := r.Body()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(r.Status)
	_, _ = w.Write(body)
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

// OrderView is the body of GET /orders/{order_no}: the order and its
// payment state. Only the read carries it; a create or cancel answers
// OrderResponse, which every transport's message mirrors field for field.
type OrderView struct {
	OrderResponse
	// Currency is the ISO 4217 code of the order's amounts.
	Currency string `json:"currency"`
	// RefundedCents is what the providers refunded of the order's settled
	// payment, 0 when none is settled.
	RefundedCents int64 `json:"refunded_cents"`
}

var orderNoPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidateCreate checks a create request against its principal before
// anything is claimed, so bad input writes nothing: a proposed order number
// of the wrong form is 400, a user_id that is not the principal's is 403.
// It returns nil for a valid request.
func ValidateCreate(userID int64, req CreateRequest) *idempotency.Problem {
	if req.OrderNo != "" && !orderNoPattern.MatchString(req.OrderNo) {
		return idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body",
			"order_no must be 1-64 characters of A-Z a-z 0-9 _ -")
	}
	if req.UserID != userID {
		return idempotency.NewProblem(http.StatusForbidden, ProblemForbidden, "Forbidden", "user_id must equal X-User-ID")
	}
	return nil
}

// Unprotected runs op in a plain transaction, committed on a 2xx and rolled
// back otherwise: a write without the idempotency protocol, the baseline of
// the benchmarks (Options.Idempotency false) over every transport. A
// failed COMMIT is answered commit-outcome-unknown: nothing finds the
// outcome out.
func (s *Service) Unprotected(ctx context.Context, op func(tx *sql.Tx) Reply) Reply {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return failure(err)
	}
	r := op(tx)
	if r.Problem != nil || r.Status < 200 || r.Status > 299 {
		_ = tx.Rollback()
		return r
	}
	if err := tx.Commit(); err != nil {
		return Reply{Problem: commitFailure(err)}
	}
	return r
}

// Create prices the order from the catalog (never from the client), redeems
// the coupon with a guarded transition and inserts the order INIT → CREATED,
// all in tx, for the principal userID (whom ValidateCreate has checked
// against req). The order carries the scope and key of the idempotent
// execution in ctx, if any.
func (s *Service) Create(ctx context.Context, tx *sql.Tx, userID int64, req CreateRequest) Reply {
	_ = userID // the principal; req.UserID equals it (ValidateCreate)
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
			return Reply{Problem: idempotency.NewProblem(http.StatusConflict, "duplicate-order", "Duplicate order",
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
	resp := toResponse(order)
	return Reply{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/" + order.OrderNo}}, Order: &resp}
}

// Transition moves the principal's order orderNo from one status to
// another by a guarded transition in tx (cancel: CREATED → CANCELED; pay:
// CREATED → PAID). Another user's order is not found.
func (s *Service) Transition(ctx context.Context, tx *sql.Tx, userID int64, orderNo string, from, to idempotency.OrderStatus) Reply {
	order, err := s.sql.orders.Get(ctx, tx, orderNo)
	if errors.Is(err, idempotency.ErrOrderNotFound) || (err == nil && order.UserID != userID) {
		return Reply{Problem: notFound()}
	}
	if err != nil {
		return failure(err)
	}
	err = s.sql.orders.Transition(ctx, tx, order.OrderNo, from, to)
	var te *idempotency.TransitionError
	if errors.As(err, &te) {
		return Reply{Problem: idempotency.NewProblem(http.StatusConflict, ProblemInvalidTransition,
			"Invalid transition", fmt.Sprintf("order %s is %s; only a %s order can become %s", order.OrderNo, te.Actual, from, to))}
	}
	if err != nil {
		return failure(err)
	}
	order.Status = to
	resp := toResponse(order)
	return Reply{Status: http.StatusOK, Order: &resp}
}

// Cancel is the principal's cancel of the order orderNo in tx: the
// payment state machine's cancel request (Orders.RequestCancel), so that a
// cancel racing a payment's callbacks ends where the facts lead whatever
// the order of arrival. A CREATED order becomes CANCELED; a PAID one
// becomes CANCELED and owes its refund (Orders.ListAnomalies lists it). An
// order already CANCELED or REFUNDED is 409 invalid-transition, as a
// second cancel under a new key always was. Another user's order is not
// found.
//
// The 409 is decided on an unlocked read: two cancels under different keys
// that meet on one CREATED order may both answer 200 CANCELED, each having
// asked for what the order became.
func (s *Service) Cancel(ctx context.Context, tx *sql.Tx, userID int64, orderNo string) Reply {
	order, err := s.sql.orders.Get(ctx, tx, orderNo)
	if errors.Is(err, idempotency.ErrOrderNotFound) || (err == nil && order.UserID != userID) {
		return Reply{Problem: notFound()}
	}
	if err != nil {
		return failure(err)
	}
	if order.Status == idempotency.OrderCanceled || order.Status == idempotency.OrderRefunded {
		return cannotCancel(order.OrderNo, order.Status)
	}
	status, err := s.sql.orders.RequestCancel(ctx, tx, order.OrderNo)
	var te *idempotency.TransitionError
	if errors.As(err, &te) {
		return cannotCancel(order.OrderNo, te.Actual)
	}
	if err != nil {
		return failure(err) // ErrPaymentConflict is transient: 503, retry
	}
	order.Status = status
	resp := toResponse(order)
	return Reply{Status: http.StatusOK, Order: &resp}
}

func cannotCancel(orderNo string, status idempotency.OrderStatus) Reply {
	return Reply{Problem: idempotency.NewProblem(http.StatusConflict, ProblemInvalidTransition, "Invalid transition",
		fmt.Sprintf("order %s is %s; only a CREATED or PAID order can be canceled", orderNo, status))}
}

// Get reads the principal's order orderNo and its payment state; another
// user's is not found. The reply's Order is the order, its View the order
// with its currency and refunded amount. The order and its payment are two
// reads: an event applied between them may show in refunded_cents before
// it shows in the status (both only grow).
func (s *Service) Get(ctx context.Context, userID int64, orderNo string) Reply {
	order, err := s.sql.orders.Get(ctx, s.db, orderNo)
	if errors.Is(err, idempotency.ErrOrderNotFound) || (err == nil && order.UserID != userID) {
		return Reply{Problem: notFound()}
	}
	if err != nil {
		return Reply{Problem: serverProblem(err, "The database failed for a moment. Retry the read.")}
	}
	var refunded int64
	err = s.db.QueryRowContext(ctx, s.sql.refundedCents, order.OrderNo).Scan(&refunded)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Reply{Problem: serverProblem(err, "The database failed for a moment. Retry the read.")}
	}
	resp := toResponse(order)
	return Reply{Status: http.StatusOK, Order: &resp,
		View: &OrderView{OrderResponse: resp, Currency: order.Currency, RefundedCents: refunded}}
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

func unprocessable(kind, title, detail string) Reply {
	return Reply{Problem: idempotency.NewProblem(http.StatusUnprocessableEntity, kind, title, detail)}
}

// failure is a server-side error of a write handler. The middleware treats
// every 5xx as not final: the transaction rolls back, the key is released and
// a retry executes again. So a transient error is 503 with Retry-After (the
// retry will likely succeed, and clients and proxies know to make it), and
// anything else 500 (a bug, which a retry would likely meet again).
func failure(err error) Reply {
	return Reply{Problem: serverProblem(err,
		"The database failed for a moment; nothing was recorded. Retry with the same key.")}
}

// serverProblem classifies err: 503 store-unavailable with Retry-After and
// transientDetail when idempotency.IsTransient, else 500 execution-failed.
// The answer never carries err's text (a driver's message names tables,
// statements and servers); the log does.
func serverProblem(err error, transientDetail string) *idempotency.Problem {
	if idempotency.IsTransient(err) {
		p := idempotency.NewProblem(http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable,
			"Database unavailable", transientDetail)
		p.RetryAfter = 1
		return p
	}
	return unexpected(err)
}

// unexpected is 500 execution-failed for err, which is logged, not
// answered.
func unexpected(err error) *idempotency.Problem {
	slog.Error("orderservice: internal error", "err", err)
	return idempotency.NewProblem(http.StatusInternalServerError,
		idempotency.ProblemExecutionFailed, "Internal error", "The server failed to process the request; the error is in its log.")
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
	return unexpected(fmt.Errorf("commit: %w", err))
}

func notFound() *idempotency.Problem {
	return idempotency.NewProblem(http.StatusNotFound, ProblemNotFound, "Not found", "No such order for this user.")
}
