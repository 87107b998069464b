package idemamqp

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// On a quorum queue the count is the larger of the broker's and this
// consumer's own: RabbitMQ 4.3 does not count a requeue by basic.nack, so
// a broker's count that stays at 0 must not keep a failing message from
// its MaxDeliveries.
func TestSeen_QuorumQueue_TheLargerOfTheBrokersCountAndOurs(t *testing.T) {
	t.Parallel()
	c := newDeliveryCounts()
	stuck := func(redelivered bool) amqp.Delivery {
		return amqp.Delivery{Redelivered: redelivered, Headers: amqp.Table{"x-delivery-count": int64(0)}}
	}
	require.Equal(t, 1, c.seen(QuorumQueue, "key:k", stuck(false)))
	require.Equal(t, 2, c.seen(QuorumQueue, "key:k", stuck(true)))
	require.Equal(t, 3, c.seen(QuorumQueue, "key:k", stuck(true)), "the broker says 0 requeues: ours count")

	counted := amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int64(6)}}
	require.Equal(t, 7, c.seen(QuorumQueue, "key:other", counted), "the broker saw more (other consumers, restarts)")
}
