package postgres_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The order state machine (idempotency.PostgresOrders) on the
// purchase_order table of the PostgreSQL migrations.

func newOrder(orderNo, key string) *idempotency.Order {
	coupon := int64(3)
	return &idempotency.Order{
		OrderNo: orderNo, Scope: "7", IdempotencyKey: key,
		UserID: 7, SKUID: 20001, Quantity: 2, CouponID: &coupon,
		UnitPriceCents: 1000, DiscountCents: 500, TotalCents: 1500,
	}
}

// inTx runs f in a transaction and commits it.
func inTx(t *testing.T, db *sql.DB, f func(tx *sql.Tx) error) error {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func TestOrders_CreateThenGet_ReturnsTheCreatedOrder(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	for _, o := range []*idempotency.Order{newOrder("O-1", "k-1"), {OrderNo: "O-2", Scope: "7", UserID: 7, SKUID: 20002, Quantity: 1, UnitPriceCents: 1025, TotalCents: 1025}} {
		require.NoError(t, inTx(t, db, func(tx *sql.Tx) error { return idempotency.PostgresOrders.Create(ctx, tx, o) }))
		require.Equal(t, idempotency.OrderCreated, o.Status)
		got, err := idempotency.PostgresOrders.Get(ctx, db, o.OrderNo)
		require.NoError(t, err)
		require.Equal(t, o, got)
	}
	var key sql.NullString
	require.NoError(t, db.QueryRow(`SELECT idempotency_key FROM purchase_order WHERE order_no = 'O-2'`).Scan(&key))
	require.False(t, key.Valid, "an order without a key stores NULL, which UNIQUE (scope, idempotency_key) does not constrain")
}

func TestOrders_Transition_FollowsTheStateMachineWithGuardedUpdates(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	require.NoError(t, inTx(t, db, func(tx *sql.Tx) error { return idempotency.PostgresOrders.Create(ctx, tx, newOrder("O-1", "k-1")) }))

	tests := []struct {
		name     string
		from, to idempotency.OrderStatus
		actual   idempotency.OrderStatus // the state a refused move reports; "" when allowed
	}{
		{"CREATED to PAID is allowed", idempotency.OrderCreated, idempotency.OrderPaid, ""},
		{"a second payment finds it PAID", idempotency.OrderCreated, idempotency.OrderPaid, idempotency.OrderPaid},
		{"a cancel after payment finds it PAID", idempotency.OrderCreated, idempotency.OrderCanceled, idempotency.OrderPaid},
	}
	for _, tc := range tests {
		err := inTx(t, db, func(tx *sql.Tx) error {
			return idempotency.PostgresOrders.Transition(ctx, tx, "O-1", tc.from, tc.to)
		})
		if tc.actual == "" {
			require.NoError(t, err, tc.name)
			continue
		}
		var te *idempotency.TransitionError
		require.ErrorAs(t, err, &te, tc.name)
		require.ErrorIs(t, err, idempotency.ErrInvalidTransition, tc.name)
		require.Equal(t, tc.actual, te.Actual, tc.name)
	}
	got, err := idempotency.PostgresOrders.Get(ctx, db, "O-1")
	require.NoError(t, err)
	require.Equal(t, idempotency.OrderPaid, got.Status)

	err = inTx(t, db, func(tx *sql.Tx) error {
		return idempotency.PostgresOrders.Transition(ctx, tx, "O-missing", idempotency.OrderCreated, idempotency.OrderPaid)
	})
	require.ErrorIs(t, err, idempotency.ErrOrderNotFound)
	_, err = idempotency.PostgresOrders.Get(ctx, db, "O-missing")
	require.ErrorIs(t, err, idempotency.ErrOrderNotFound)
}

// A duplicate inserts nothing instead of raising 23505, which in PostgreSQL
// would abort the whole transaction: the handler can answer it and go on.
func TestOrders_DuplicateKeyOrOrderNo_IsErrDuplicateOrderAndTheTransactionGoesOn(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	require.NoError(t, inTx(t, db, func(tx *sql.Tx) error { return idempotency.PostgresOrders.Create(ctx, tx, newOrder("O-1", "k-1")) }))

	for name, dup := range map[string]*idempotency.Order{
		"same scope and key": newOrder("O-2", "k-1"),
		"same order number":  newOrder("O-1", "k-2"),
	} {
		err := inTx(t, db, func(tx *sql.Tx) error {
			err := idempotency.PostgresOrders.Create(ctx, tx, dup)
			require.ErrorIs(t, err, idempotency.ErrDuplicateOrder, name)
			// The transaction is not aborted.
			return idempotency.PostgresOrders.Create(ctx, tx, newOrder("O-after-"+dup.IdempotencyKey, "k-after-"+dup.OrderNo))
		})
		require.NoError(t, err, name)
	}
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&n))
	require.Equal(t, 3, n)
}

// Two transactions create an order for the same key: at READ COMMITTED the
// second insert waits for the first transaction and, once it commits, skips
// the row and reports ErrDuplicateOrder.
func TestOrders_ConcurrentSameKey_SecondWaitsForTheFirstCommitThenIsErrDuplicateOrder(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, idempotency.PostgresOrders.Create(ctx, first, newOrder("O-1", "k-1")))

	second := make(chan error, 1)
	go func() { // no require in this goroutine
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			second <- err
			return
		}
		defer tx.Rollback() //nolint:errcheck
		second <- idempotency.PostgresOrders.Create(ctx, tx, newOrder("O-2", "k-1"))
	}()
	select {
	case err := <-second:
		t.Fatalf("the second insert must wait for the first transaction, got %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, first.Commit())
	require.ErrorIs(t, <-second, idempotency.ErrDuplicateOrder)
}
