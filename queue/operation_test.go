package queue_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

// A Middleware that declares its Operation declares the action for the
// queue too: the processor takes its route, and refuses one of its own.
func TestNew_MiddlewareWithOperation_TheActionIsItsAlone(t *testing.T) {
	t.Parallel()
	op := &idempotency.Operation{Name: "cancel_order", Route: "POST /orders/{order_no}/cancel"}
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), &idempotency.Config{Operation: op})
	require.NoError(t, err)
	handler := func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
		return idempotency.Result{Status: 200}
	}

	p, err := queue.New("orders.cancel", queue.Config{Middleware: mw, Handler: handler})
	require.NoError(t, err)
	require.Equal(t, op.Route, p.Config().Route, "the operation's route, not POST /orders.cancel")

	for _, cfg := range []queue.Config{
		{Middleware: mw, Handler: handler, Route: "POST /orders.cancel"},
		{Middleware: mw, Handler: handler, Fingerprint: idempotency.FingerprintConfig{Fields: []string{"order_no"}}},
	} {
		_, err := queue.New("orders.cancel", cfg)
		require.ErrorContains(t, err, "declares the action")
	}
}
