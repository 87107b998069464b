package idemredis

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/history"
)

// fleetBody is what every request of a fleet's load sends (tryPost with sku
// 5): one fingerprint for every key.
const fleetBody = `{"sku":5}`

// historyResponse is tryPost's outcome as the history records it.
func historyResponse(a answer, err error) history.Response {
	if err != nil {
		return history.Failed(err)
	}
	return history.Answer(a.status, a.header, []byte(a.body))
}

// checkHistory checks every request of the fleet's load, through the Redis
// fault, against the HTTP contract's model and the orders the run left
// (internal/history, with porcupine): whatever Redis answered or failed to,
// every replay is the first answer and no key has two orders.
func (f *fleet) checkHistory(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orders, err := history.ReadOrders(ctx, f.b.db, "SELECT idem_key, CAST(id AS CHAR) FROM test_order WHERE scope = 'u1'")
	require.NoError(t, err)
	history.Check(t, f.hist, orders, history.Config{OrderOf: history.JSONField("order_id")})
}
