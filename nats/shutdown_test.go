package idemnats_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// On shutdown every message the Consumer took and did not begin is handed
// back at once, those waiting for a worker and those still in the
// client's prefetch buffer alike: another consumer of the durable gets
// them within seconds, not after AckWait, while a worker still does its
// own.
func TestOnShutdown_TheMessagesNotBegun_AreDeliveredAgainAtOnce_NotAfterAckWait(t *testing.T) {
	t.Parallel()
	const n = 20
	began := make(chan string, n)
	release := make(chan struct{})
	b := newBundle(t, func(c *idemnats.Config) {
		c.Workers, c.BatchSize, c.Prefetch = 1, 1, 2*n
		handler := c.Handler
		c.Handler = func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
			key, _ := m.HeaderValue("Idempotency-Key")
			began <- key
			<-release
			return handler(ctx, tx, m)
		}
	})
	b.create(t, func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Minute })
	for i := range n {
		b.publish(t, nats.Header{"Idempotency-Key": {fmt.Sprintf("k%d", i)}}, `{"a":1}`)
	}
	r := b.start(t)
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the Run's own cleanup waits for it

	var inWorker string
	select {
	case inWorker = <-began:
	case <-time.After(30 * time.Second):
		t.Fatal("no message began within 30s")
	}
	require.Eventually(t, func() bool {
		info, err := b.cons.Info(context.Background())
		return err == nil && info.NumAckPending == n
	}, 30*time.Second, 10*time.Millisecond, "the Consumer took every message: one in its worker, the rest waiting")

	r.cancel()
	got := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second) // AckWait is a minute
	for len(got) < n-1 && time.Now().Before(deadline) {
		batch, err := b.cons.Fetch(n-1-len(got), jetstream.FetchMaxWait(time.Until(deadline)))
		require.NoError(t, err)
		for msg := range batch.Messages() {
			got[msg.Headers().Get("Idempotency-Key")] = true
			require.NoError(t, msg.Ack())
		}
	}
	require.Len(t, got, n-1, "every message but the worker's, within seconds: %v", got)
	require.False(t, got[inWorker], "the worker's message is its own until it settles")

	unblock()
	require.NoError(t, r.wait())
	require.Empty(t, began, "no other message began")
}
