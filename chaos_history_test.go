package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/history"
)

// chaosHistoryKey names a request's key in the history as the orders table
// names it: scope (the user) and idempotency key.
func chaosHistoryKey(user int, key string) string { return fmt.Sprint(user) + "/" + key }

// checkHistory checks every request the chaos clients sent, with the
// answer each got, against the HTTP contract's model and the orders the run
// left (internal/history, with porcupine). Every chaos test runs it when it
// ends.
func (e *chaosEnv) checkHistory(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orders, err := history.ReadOrders(ctx, e.direct, "SELECT CONCAT(scope, '/', idempotency_key), order_no FROM purchase_order")
	require.NoError(t, err)
	history.Check(t, e.hist, orders, history.Config{OrderOf: history.JSONField("order_no")})
}
