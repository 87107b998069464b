package orderqueue

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// The orders' queue always dead-letters to the dead letters' queue, and
// lifts the delivery limit only on a broker that reads -1 as no limit:
// RabbitMQ 3 reads it as a limit and drops a message on its first requeue.
func TestOrdersQueueArguments_LiftTheDeliveryLimitOnlyOnRabbitMQ4(t *testing.T) {
	t.Parallel()
	topo := NamedTopology("ORDERS", "orders.create", "orderconsumer", "orders.create")
	for _, tc := range []struct {
		name   string
		server amqp.Table
		lifted bool // x-delivery-limit -1 declared
	}{
		{name: "RabbitMQ 3.10: no limit unless one is set", server: amqp.Table{"product": "RabbitMQ", "version": "3.10.8"}},
		{name: "RabbitMQ 3.13", server: amqp.Table{"product": "RabbitMQ", "version": "3.13.7"}},
		{name: "RabbitMQ 4.0: 20 by default", server: amqp.Table{"product": "RabbitMQ", "version": "4.0.5"}, lifted: true},
		{name: "RabbitMQ 4.3", server: amqp.Table{"product": "RabbitMQ", "version": "4.3.0"}, lifted: true},
		{name: "a version it cannot read", server: amqp.Table{"product": "RabbitMQ", "version": "main"}},
		{name: "another product", server: amqp.Table{"product": "LavinMQ", "version": "4.0.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.create.dead-letter"}
			if tc.lifted {
				want["x-delivery-limit"] = int64(-1)
			}
			require.Equal(t, want, ordersQueueArguments(tc.server, topo))
		})
	}
}
