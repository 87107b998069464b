package crosstransport_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// One action, any transport. For every operation that several transports
// carry and every ordered pair of transports, with one key: the first
// transport executes the action; the second replays the first answer in
// its own terms (the same status, the same order field for field, the same
// Location), and the action had exactly one effect; the same key with
// other parameters over the second transport is refused as reused. The
// action's identity is declared once, on its Middleware
// (orderservice.CreateOperation, CancelOperation), and no front-end
// redeclares it. Claim-first on MariaDB, single-phase on PostgreSQL.
func TestOneAction_AnyTransport(t *testing.T) {
	t.Parallel()
	databases := []struct {
		db   frontendtest.Database
		mode idempotency.Mode
	}{{frontendtest.MySQL, idempotency.ModeClaimFirst}, {pgtest.Database, idempotency.ModeSinglePhase}}
	for _, d := range databases {
		t.Run(d.db.Name(), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, d.db, d.mode)
			for _, a := range w.transports {
				for _, b := range w.transports {
					t.Run("create/"+a.name+"-then-"+b.name, func(t *testing.T) {
						t.Parallel()
						w.createOverTwo(t, a, b)
					})
					t.Run("cancel/"+a.name+"-then-"+b.name, func(t *testing.T) {
						t.Parallel()
						w.cancelOverTwo(t, a, b)
					})
				}
			}
		})
	}
}

func (w *world) createOverTwo(t *testing.T, a, b transport) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user, key := w.user(), "create-"+a.name+"-"+b.name

	first := a.create(ctx, t, user, key, 2)
	require.Equal(t, 201, first.Status, "%s executes: %s", a.name, first)
	require.False(t, first.Replayed, "%s", first)
	orderNo, _ := first.Order["order_no"].(string)
	require.NotEmpty(t, orderNo, "%s", first)
	require.Equal(t, "/orders/"+orderNo, first.Location, "%s answers as the HTTP route does: %s", a.name, first)

	again := b.create(ctx, t, user, key, 2)
	require.Equal(t, 201, again.Status, "%s replays: %s", b.name, again)
	require.True(t, again.Replayed, "%s", again)
	require.Equal(t, first.Order, again.Order, "%s replays %s's order field for field", b.name, a.name)
	require.Equal(t, first.Location, again.Location, "%s replays the Location", b.name)
	require.Equal(t, 1, w.orders(t, user, key), "one order")

	changed := b.create(ctx, t, user, key, 3)
	require.Equal(t, 409, changed.Status, "other parameters under the key: %s", changed)
	require.Equal(t, idempotency.ProblemKeyReused, changed.Kind, "%s", changed)
	require.Equal(t, 1, w.orders(t, user, key), "still one order")
}

func (w *world) cancelOverTwo(t *testing.T, a, b transport) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user, key := w.user(), "cancel-"+a.name+"-"+b.name
	orderNo, otherNo := w.newOrder(ctx, t, user, "order"), w.newOrder(ctx, t, user, "other")
	require.NotEqual(t, orderNo, otherNo)

	first := a.cancel(ctx, t, user, key, orderNo)
	require.Equal(t, 200, first.Status, "%s executes: %s", a.name, first)
	require.False(t, first.Replayed, "%s", first)
	require.Equal(t, string(idempotency.OrderCanceled), first.Order["status"], "%s", first)

	again := b.cancel(ctx, t, user, key, orderNo)
	require.Equal(t, 200, again.Status, "%s replays (a second run would meet a CANCELED order): %s", b.name, again)
	require.True(t, again.Replayed, "%s", again)
	require.Equal(t, first.Order, again.Order, "%s replays %s's order field for field", b.name, a.name)
	require.Equal(t, first.Location, again.Location)

	changed := b.cancel(ctx, t, user, key, otherNo)
	require.Equal(t, 409, changed.Status, "another order under the key: %s", changed)
	require.Equal(t, idempotency.ProblemKeyReused, changed.Kind, "%s", changed)
	other := w.svc.Get(ctx, user, otherNo)
	require.Equal(t, string(idempotency.OrderCreated), other.Order.Status, "the other order is untouched")
}

// newOrder creates an order of user's over HTTP under a key of its own.
func (w *world) newOrder(ctx context.Context, t *testing.T, user int64, name string) string {
	t.Helper()
	a := w.http.create(ctx, t, user, "setup-"+name, 1)
	require.Equal(t, 201, a.Status, "%s", a)
	return a.Order["order_no"].(string)
}

// orders counts the orders of user's key.
func (w *world) orders(t *testing.T, user int64, key string) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ?"
	if w.dialect == "postgres" {
		q = "SELECT COUNT(*) FROM purchase_order WHERE scope = $1 AND idempotency_key = $2"
	}
	var n int
	require.NoError(t, w.db.QueryRow(q, scopeOf(user), key).Scan(&n))
	return n
}

// world is the example service on one database, served over every
// transport at once.
type world struct {
	svc        *orderservice.Service
	db         *sql.DB
	dialect    string
	http       transport
	transports []transport
	users      chan int64
}

func newWorld(t *testing.T, db frontendtest.Database, mode idempotency.Mode) *world {
	sqlDB, store, dialect := db.Open(t)
	require.NoError(t, orderservice.Setup(context.Background(), sqlDB, dialect))
	svc, err := orderservice.New(sqlDB, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect,
		Config: idempotency.Config{Mode: mode, Lease: 5 * time.Second}})
	require.NoError(t, err)
	w := &world{svc: svc, db: sqlDB, dialect: dialect, users: make(chan int64, 1)}
	w.users <- 1000
	w.http = overHTTP(t, "http", svc)
	w.transports = []transport{w.http, overGin(t, svc), overEcho(t, svc), overGRPC(t, svc),
		overQueue(t, "nats", svc), overQueue(t, "amqp", svc)}
	return w
}

// user returns a principal no other spec uses.
func (w *world) user() int64 {
	u := <-w.users
	w.users <- u + 1
	return u
}
