package idemamqp_test

import (
	"context"
	"net/http"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	idemamqp "github.com/orderguard/idempotency/amqp"
	"github.com/orderguard/idempotency/queue"
)

// decisions returns the next n settlements as "decision reason" lines.
func (b *testBundle) decisions(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		s := b.next(t)
		out = append(out, s.Decision.String()+" "+s.Reason)
	}
	return out
}

// A classic queue keeps no count: the consumer counts the deliveries of
// each key the processor claims, whatever carries it, and a message whose
// handler keeps failing is dead-lettered at MaxDeliveries.
func TestOnAClassicQueue_AMessageWithoutAnID_IsCountedByItsKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mwCfg *idempotency.Config
		key   func(m *queue.Message) (string, error)
	}{
		{name: "the Middleware's own key header", mwCfg: &idempotency.Config{HeaderName: "Order-Key"}},
		{name: "a Config.Key of its own", key: func(m *queue.Message) (string, error) {
			v, _ := m.HeaderValue("Order-Key")
			if v == "" {
				return "", idempotency.ErrMissingKey
			}
			return "order:" + v, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupMiddleware(t, nil, tc.mwCfg, func(c *idemamqp.Config) { c.Key = tc.key })
			b.status.Store(http.StatusInternalServerError)
			b.publish(t, amqp.Publishing{Headers: amqp.Table{"Order-Key": "k1"}, Body: []byte(`{"a":1}`)})
			require.Equal(t, []string{"nak ", "nak ", "dead-letter " + queue.ReasonMaxDeliveries}, b.decisions(t, 3))
			dl, ok, err := b.ch.Get(b.dead, true)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, "3", dl.Headers[queue.DeliveriesHeader])
		})
	}
}

// On a classic queue only a publisher can have set x-delivery-count: a
// dead letter moved back to its queue with the headers of its last life,
// or a count forged to have a message dead-lettered at once, starts at
// delivery 1.
func TestOnAClassicQueue_ADeliveryCountThePublisherSent_IsNotTrusted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		headers amqp.Table
	}{
		{name: "a dead letter moved back with its old headers", headers: amqp.Table{
			"x-delivery-count": int64(2), "x-death": []any{amqp.Table{"count": int64(1), "queue": "orders", "reason": "delivery_limit"}},
			"x-first-death-queue": "orders", "x-first-death-reason": "delivery_limit",
			queue.ReasonHeader: queue.ReasonMaxDeliveries, queue.DeliveriesHeader: "3",
		}},
		{name: "a forged count", headers: amqp.Table{"x-delivery-count": int64(99)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			b.status.Store(http.StatusInternalServerError)
			b.publish(t, amqp.Publishing{MessageId: "m1", Headers: tc.headers, Body: []byte(`{"a":1}`)})
			first := b.next(t)
			require.Equal(t, queue.Nak, first.Decision, "%+v", first)
			require.Equal(t, 1, first.Message.Delivery)
			require.Equal(t, []string{"nak ", "dead-letter " + queue.ReasonMaxDeliveries}, b.decisions(t, 2),
				"dead-lettered at MaxDeliveries of its own deliveries")
		})
	}
}

// A dead letter keeps the message's headers but the broker's counters:
// moved back to a queue after a fix, it is a new message there, and the
// broker reads no x-death of another life.
func TestADeadLetter_LeavesTheBrokersCountersBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, nil)
	b.status.Store(http.StatusInternalServerError)
	broker := amqp.Table{ // a message the broker dead-lettered once, moved back
		"x-death":             []any{amqp.Table{"count": int64(1), "queue": b.queue, "reason": "delivery_limit", "exchange": ""}},
		"x-first-death-queue": b.queue, "x-first-death-reason": "delivery_limit", "x-first-death-exchange": "",
		"x-last-death-queue": b.queue, "x-last-death-reason": "delivery_limit", "x-last-death-exchange": "",
	}
	h := amqp.Table{"Idempotency-Key": "k1", "X-Tenant": "t1"}
	for k, v := range broker {
		h[k] = v
	}
	b.publish(t, amqp.Publishing{MessageId: "m1", Headers: h, Body: []byte(`{"a":1}`)})
	require.Equal(t, []string{"nak ", "nak ", "dead-letter " + queue.ReasonMaxDeliveries}, b.decisions(t, 3))
	dl, ok, err := b.ch.Get(b.dead, true)
	require.NoError(t, err)
	require.True(t, ok)
	for name := range broker {
		require.NotContains(t, dl.Headers, name)
	}
	require.NotContains(t, dl.Headers, "x-delivery-count", "the quorum queue's count stays behind")
	require.Equal(t, "k1", dl.Headers["Idempotency-Key"])
	require.Equal(t, "t1", dl.Headers["X-Tenant"])
	require.Equal(t, "3", dl.Headers[queue.DeliveriesHeader])

	// Moved back, it fails from its first delivery again.
	require.NoError(t, b.ch.PublishWithContext(context.Background(), "", b.queue, false, false, amqp.Publishing{
		Headers: dl.Headers, MessageId: dl.MessageId, ContentType: dl.ContentType, Body: dl.Body}))
	again := b.next(t)
	require.Equal(t, queue.Nak, again.Decision, "%+v", again)
	require.Equal(t, 1, again.Message.Delivery)
}

func TestNew_RefusesAQueueTypeItCannotCount(t *testing.T) {
	t.Parallel()
	_, err := idemamqp.New(idemamqp.Config{URL: "amqp://127.0.0.1/", Queue: "q", QueueType: "stream"})
	require.ErrorContains(t, err, `Config.QueueType "stream"`)
}
