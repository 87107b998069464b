package orderqueue_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/queue"
)

// One action, whatever the transport: the example's HTTP API and the
// consumer, on one database. A key used over HTTP and then in a message
// with the same business fields is replayed to the message (no second
// order, the first answer); with other fields the message is refused as a
// conflict and dead-lettered. And the other way round. Claim-first on
// MariaDB, single-phase on PostgreSQL.
func TestOneAction_OverHTTPAndAQueue_OnOneDatabase(t *testing.T) {
	t.Parallel()
	modes := map[string]idempotency.Mode{"mysql": idempotency.ModeClaimFirst, "postgres": idempotency.ModeSinglePhase}
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				r := newFaultRun(t, broker(t), db, modes[db.Name()])
				consumer(t, r.svc, r.options())
				srv := httptest.NewServer(r.svc)
				t.Cleanup(srv.Close)
				overHTTP := frontendtest.HTTP(srv.URL)
				pub := publisher(t, r.broker, r.topo)
				ctx := context.Background()
				send := func(key string, quantity int) frontendtest.Answer {
					t.Helper()
					reply, err := orderqueue.Request(ctx, pub, orderqueue.Message{User: "7", Key: key,
						Body: createBody(7, orderservice.FirstSKU, quantity, nil)})
					require.NoError(t, err)
					h := http.Header{}
					for k, v := range reply.Header {
						h.Set(k, v)
					}
					return frontendtest.HTTPAnswer(reply.Status, h, reply.Body)
				}
				create := func(key string, quantity int) frontendtest.Request {
					return frontendtest.Request{User: 7, Key: key, SKU: orderservice.FirstSKU, Quantity: quantity}
				}

				// HTTP first.
				first := overHTTP.Create(ctx, create("over-http", 2))
				require.Equal(t, http.StatusCreated, first.Status, "%s", first)
				again := send("over-http", 2)
				require.True(t, again.Replayed, "the message is the same action: %s", again)
				require.Equal(t, first.Raw, again.Raw, "the first answer, as HTTP carried it")
				changed := send("over-http", 3)
				require.Equal(t, http.StatusConflict, changed.Status, "%s", changed)
				require.Equal(t, idempotency.ProblemKeyReused, changed.Kind)

				// The queue first.
				queued := send("over-queue", 1)
				require.Equal(t, http.StatusCreated, queued.Status, "%s", queued)
				require.False(t, queued.Replayed)
				viaHTTP := overHTTP.Create(ctx, create("over-queue", 1))
				require.True(t, viaHTTP.Replayed, "%s", viaHTTP)
				require.Equal(t, queued.Raw, viaHTTP.Raw)
				conflict := overHTTP.Create(ctx, create("over-queue", 4))
				require.Equal(t, http.StatusConflict, conflict.Status, "%s", conflict)

				require.Equal(t, map[string]int{"over-http": 1, "over-queue": 1}, r.ordersByKey(t))
				// The reply goes out before the dead letter is stored: wait for it.
				require.Eventually(t, func() bool { return r.settled.count(queue.DeadLetter) == 1 }, 30*time.Second,
					5*time.Millisecond, "the conflicting message was dead-lettered")
				t.Logf("order over HTTP %s replayed to the queue; order over the queue %s replayed over HTTP (scope %s)",
					first.OrderNo, queued.OrderNo, strconv.Itoa(7))
			})
		}
	}
}
