package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// OrderStatus is the state of a purchase_order row.
type OrderStatus string

// Order states. An order is inserted INIT and moved to CREATED in the same
// transaction; PAID and CANCELED follow from CREATED, REFUNDED from a
// payment refunded in full.
//
// Transition makes any move orderTransitions lists. The payment path
// (Orders.ApplyPayment and Orders.RequestCancel, order_payment.go) does not
// choose moves: it derives the state from the order's facts (paid, refunded
// amount, cancel requested) and makes the move from the state it read to the
// derived one, which is always one of the moves listed here.
const (
	OrderInit     OrderStatus = "INIT"
	OrderCreated  OrderStatus = "CREATED"
	OrderPaid     OrderStatus = "PAID"
	OrderCanceled OrderStatus = "CANCELED"
	OrderRefunded OrderStatus = "REFUNDED"
)

// orderTransitions is the whole state machine: every allowed move. The
// payment facts only grow (a payment is made once, refunds add up, a cancel
// request is never withdrawn), so no move leads back: CREATED goes to PAID,
// to CANCELED, or straight to REFUNDED when refunds that arrived before the
// payment's success cover it; PAID goes to CANCELED (a user cancel after
// payment: a refund is owed) or REFUNDED; CANCELED goes to REFUNDED when
// the owed refund arrives. REFUNDED is final.
var orderTransitions = map[OrderStatus][]OrderStatus{
	OrderInit:     {OrderCreated, OrderCanceled},
	OrderCreated:  {OrderPaid, OrderCanceled, OrderRefunded},
	OrderPaid:     {OrderCanceled, OrderRefunded},
	OrderCanceled: {OrderRefunded},
}

// CanTransition reports whether the state machine allows from → to.
func CanTransition(from, to OrderStatus) bool {
	for _, s := range orderTransitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

var (
	// ErrOrderNotFound means no purchase_order row has the order number.
	ErrOrderNotFound = errors.New("idempotency: order not found")

	// ErrInvalidTransition matches every *TransitionError.
	ErrInvalidTransition = errors.New("idempotency: invalid order transition")

	// ErrDuplicateOrder means purchase_order already has a row for the
	// scope and idempotency key (or the order number): the database's last
	// line of defence refused a second order.
	ErrDuplicateOrder = errors.New("idempotency: duplicate order")
)

// TransitionError reports a guarded transition that matched no row because
// the order was not in the expected state.
type TransitionError struct {
	OrderNo string
	From    OrderStatus // the state the caller expected
	To      OrderStatus
	Actual  OrderStatus // the state found, when it could be read
}

func (e *TransitionError) Error() string {
	if !CanTransition(e.From, e.To) {
		return fmt.Sprintf("idempotency: order %s: %s → %s is not a transition of the order state machine", e.OrderNo, e.From, e.To)
	}
	return fmt.Sprintf("idempotency: order %s is %s, not %s: cannot move it to %s", e.OrderNo, e.Actual, e.From, e.To)
}

// Is lets errors.Is(err, ErrInvalidTransition) match.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// Order is a purchase_order row.
type Order struct {
	OrderNo        string
	Scope          string
	IdempotencyKey string // empty for an order created without a key
	UserID         int64
	SKUID          int64
	Quantity       int
	CouponID       *int64
	UnitPriceCents int64
	DiscountCents  int64
	TotalCents     int64
	// Currency is the ISO 4217 code of the amounts, upper case; Create
	// stores DefaultCurrency for an empty one. A payment applies only in
	// this currency.
	Currency string
	Status   OrderStatus
}

// DefaultCurrency is the currency of an order created without one, and of
// every order that existed before migration 005 added the column (its
// default): CNY, the currency of the providers this library answers first
// (Alipay, WeChat Pay). A deployment in another currency sets
// Order.Currency on every order.
const DefaultCurrency = "CNY"

// Queryer is what GetOrder and Orders.Get read through: *sql.DB, *sql.Tx or *sql.Conn.
type Queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Orders is the order state machine's SQL in one dialect: CreateOrder,
// TransitionOrder and GetOrder run MySQLOrders; a PostgreSQL service calls
// the same methods on PostgresOrders. Each dialect's statements are written
// by hand and take the same parameters in the same order.
type Orders struct {
	// InsertOrder writes one order. Parameters: order_no, scope,
	// idempotency_key (NULL without a key), user_id, sku_id, quantity,
	// coupon_id (or NULL), unit_price_cents, discount_cents, total_cents,
	// status, currency. A duplicate either fails with the driver's unique-violation
	// error or inserts no row (ON CONFLICT DO NOTHING): both are
	// ErrDuplicateOrder.
	InsertOrder string

	// UpdateStatus moves one order between states, guarded by the state it
	// must be in. Parameters: the new status, order_no, the expected status.
	UpdateStatus string

	// SelectStatus reads one order's status. Parameter: order_no.
	SelectStatus string

	// SelectOrder reads one order's columns in Order's field order. Parameter:
	// order_no.
	SelectOrder string

	// Payments holds the statements of the payment state machine
	// (order_payment.go).
	Payments PaymentStatements
}

// MySQLOrders is the order SQL of MySQL and MariaDB, which SQLite runs too.
var MySQLOrders = Orders{
	InsertOrder: `INSERT INTO purchase_order
  (order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id,
   unit_price_cents, discount_cents, total_cents, status, currency)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	UpdateStatus: `UPDATE purchase_order SET status = ?, updated_at = CURRENT_TIMESTAMP WHERE order_no = ? AND status = ?`,
	SelectStatus: `SELECT status FROM purchase_order WHERE order_no = ?`,
	SelectOrder: `SELECT order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id,
  unit_price_cents, discount_cents, total_cents, currency, status
FROM purchase_order WHERE order_no = ?`,
	Payments: mysqlPayments,
}

// PostgresOrders is the order SQL of PostgreSQL, over the purchase_order
// table of the postgres module's migrations.
//
// The insert skips a duplicate (ON CONFLICT DO NOTHING, any unique
// constraint) instead of failing: in PostgreSQL an error aborts the whole
// transaction, so a handler could not answer the duplicate and go on, and
// every duplicate would be an ERROR in the server's log. Times come from
// clock_timestamp(), the statement's clock: now() is the transaction's start.
var PostgresOrders = Orders{
	InsertOrder: `INSERT INTO purchase_order
  (order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id,
   unit_price_cents, discount_cents, total_cents, status, currency)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT DO NOTHING`,
	UpdateStatus: `UPDATE purchase_order SET status = $1, updated_at = clock_timestamp() WHERE order_no = $2 AND status = $3`,
	SelectStatus: `SELECT status FROM purchase_order WHERE order_no = $1`,
	SelectOrder: `SELECT order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id,
  unit_price_cents, discount_cents, total_cents, currency, status
FROM purchase_order WHERE order_no = $1`,
	Payments: postgresPayments,
}

// CreateOrder inserts o as INIT and moves it to CREATED, both inside tx,
// with MySQLOrders (MySQL, MariaDB, SQLite). A second order for the same
// scope and key, or the same order number, fails with ErrDuplicateOrder.
func CreateOrder(ctx context.Context, tx *sql.Tx, o *Order) error {
	return MySQLOrders.Create(ctx, tx, o)
}

// TransitionOrder is MySQLOrders.Transition (MySQL, MariaDB, SQLite).
func TransitionOrder(ctx context.Context, tx *sql.Tx, orderNo string, from, to OrderStatus) error {
	return MySQLOrders.Transition(ctx, tx, orderNo, from, to)
}

// GetOrder is MySQLOrders.Get (MySQL, MariaDB, SQLite).
func GetOrder(ctx context.Context, q Queryer, orderNo string) (*Order, error) {
	return MySQLOrders.Get(ctx, q, orderNo)
}

// Create inserts o as INIT and moves it to CREATED, both inside tx. A
// second order for the same scope and key, or the same order number, fails
// with ErrDuplicateOrder and leaves tx usable.
func (s Orders) Create(ctx context.Context, tx *sql.Tx, o *Order) error {
	var key any
	if o.IdempotencyKey != "" {
		key = o.IdempotencyKey
	}
	var coupon any
	if o.CouponID != nil {
		coupon = *o.CouponID
	}
	if o.Currency == "" {
		o.Currency = DefaultCurrency
	}
	res, err := tx.ExecContext(ctx, s.InsertOrder,
		o.OrderNo, o.Scope, key, o.UserID, o.SKUID, o.Quantity, coupon,
		o.UnitPriceCents, o.DiscountCents, o.TotalCents, string(OrderInit), o.Currency)
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("%w: %v", ErrDuplicateOrder, err)
		}
		return fmt.Errorf("idempotency: insert order: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idempotency: insert order: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: order number %s, or scope %q and key %q, is taken", ErrDuplicateOrder, o.OrderNo, o.Scope, o.IdempotencyKey)
	}
	o.Status = OrderInit
	if err := s.Transition(ctx, tx, o.OrderNo, OrderInit, OrderCreated); err != nil {
		return err
	}
	o.Status = OrderCreated
	return nil
}

// Transition moves an order from → to inside tx with one guarded UPDATE
// (WHERE status = from): never read-then-write, so concurrent cancels,
// payments and retries cannot overwrite each other. It returns a
// *TransitionError when the order is not in state from, and ErrOrderNotFound
// when it does not exist.
func (s Orders) Transition(ctx context.Context, tx *sql.Tx, orderNo string, from, to OrderStatus) error {
	if !CanTransition(from, to) {
		return &TransitionError{OrderNo: orderNo, From: from, To: to, Actual: from}
	}
	res, err := tx.ExecContext(ctx, s.UpdateStatus, string(to), orderNo, string(from))
	if err != nil {
		return fmt.Errorf("idempotency: transition order: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idempotency: transition order: %w", err)
	}
	if n == 1 {
		return nil
	}
	// The write is done (and refused); this read only explains why.
	var actual string
	err = tx.QueryRowContext(ctx, s.SelectStatus, orderNo).Scan(&actual)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s", ErrOrderNotFound, orderNo)
	}
	return &TransitionError{OrderNo: orderNo, From: from, To: to, Actual: OrderStatus(actual)}
}

// Get reads an order by number.
func (s Orders) Get(ctx context.Context, q Queryer, orderNo string) (*Order, error) {
	o := &Order{}
	var key sql.NullString
	var coupon sql.NullInt64
	var status string
	err := q.QueryRowContext(ctx, s.SelectOrder, orderNo).Scan(
		&o.OrderNo, &o.Scope, &key, &o.UserID, &o.SKUID, &o.Quantity, &coupon,
		&o.UnitPriceCents, &o.DiscountCents, &o.TotalCents, &o.Currency, &status)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrOrderNotFound, orderNo)
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: get order: %w", err)
	}
	o.IdempotencyKey = key.String
	if coupon.Valid {
		o.CouponID = &coupon.Int64
	}
	o.Status = OrderStatus(status)
	return o, nil
}

// isUniqueViolation recognises a unique-key violation from MySQL (1062),
// from SQLite (extended codes 1555 and 2067) or by SQLSTATE 23505
// (PostgreSQL), without importing a SQLite or PostgreSQL driver into this
// package.
func isUniqueViolation(err error) bool {
	if mysqlErrorIs(err, mysqlErrDupEntry) {
		return true
	}
	if state, ok := sqlState(err); ok {
		return state == "23505"
	}
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() {
		case 1555, 2067: // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE
			return true
		}
	}
	return false
}
