package idempotency_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The order state machine on MySQL/MariaDB through the package functions
// (MySQLOrders); postgres/order_test.go runs the same rules on
// PostgresOrders.

func mysqlOrder(orderNo, key string) *idempotency.Order {
	coupon := int64(3)
	return &idempotency.Order{
		OrderNo: orderNo, Scope: "7", IdempotencyKey: key,
		UserID: 7, SKUID: 20001, Quantity: 2, CouponID: &coupon,
		UnitPriceCents: 1000, DiscountCents: 500, TotalCents: 1500,
	}
}

func TestOrders_MySQL_CreateGetTransition_FollowTheStateMachine(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	o := mysqlOrder("O-1", "k-1")
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.CreateOrder(ctx, tx, o))
	require.NoError(t, tx.Commit())
	require.Equal(t, idempotency.OrderCreated, o.Status)

	got, err := idempotency.GetOrder(ctx, db, "O-1")
	require.NoError(t, err)
	require.Equal(t, o, got)

	tx, err = db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.TransitionOrder(ctx, tx, "O-1", idempotency.OrderCreated, idempotency.OrderPaid))
	err = idempotency.TransitionOrder(ctx, tx, "O-1", idempotency.OrderCreated, idempotency.OrderCanceled)
	var te *idempotency.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, idempotency.OrderPaid, te.Actual)
	require.ErrorIs(t, idempotency.TransitionOrder(ctx, tx, "O-missing", idempotency.OrderCreated, idempotency.OrderPaid), idempotency.ErrOrderNotFound)
	require.NoError(t, tx.Commit())
	_, err = idempotency.GetOrder(ctx, db, "O-missing")
	require.ErrorIs(t, err, idempotency.ErrOrderNotFound)
}

// MySQL refuses the duplicate with 1062, which rolls back the statement
// only: the transaction goes on, as PostgresOrders' ON CONFLICT DO NOTHING
// lets it on PostgreSQL.
func TestOrders_MySQL_DuplicateKeyOrOrderNo_IsErrDuplicateOrderAndTheTransactionGoesOn(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.MySQLOrders.Create(ctx, tx, mysqlOrder("O-1", "k-1")))
	require.ErrorIs(t, idempotency.MySQLOrders.Create(ctx, tx, mysqlOrder("O-2", "k-1")), idempotency.ErrDuplicateOrder, "same scope and key")
	require.ErrorIs(t, idempotency.MySQLOrders.Create(ctx, tx, mysqlOrder("O-1", "k-2")), idempotency.ErrDuplicateOrder, "same order number")
	require.NoError(t, idempotency.MySQLOrders.Create(ctx, tx, mysqlOrder("O-3", "k-3")))
	require.NoError(t, tx.Commit())
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&n))
	require.Equal(t, 2, n)
}
