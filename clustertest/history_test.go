package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/history"
)

// checkHistory checks every answer the clients received (each with its send
// and answer times, from one monotonic clock) against the HTTP contract's
// model and the orders node 1 holds once the cluster has settled
// (internal/history, with porcupine). Requests that got no answer, as when
// their node died under them, are unknown outcomes.
func (c *cluster) checkHistory(t *testing.T, answers []answer) {
	t.Helper()
	hist := history.NewRecorder()
	for _, a := range answers {
		resp := history.Response{Status: a.status, Body: string(a.body), Replayed: a.replayed,
			Problem: a.problem.Kind(), RetryAfter: a.retryAfter}
		if a.err != nil {
			resp = history.Failed(a.err)
		}
		// Every request carries createBody's fields for its key: one
		// fingerprint per key.
		hist.Add(history.Request{Key: a.key, Fingerprint: a.key}, a.start, a.end, resp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	orders, err := history.ReadOrders(ctx, c.check[1], "SELECT idempotency_key, order_no FROM purchase_order WHERE scope = ?", scope)
	require.NoError(t, err)
	history.Check(t, hist, orders, history.Config{OrderOf: history.JSONField("order_no")})
}
