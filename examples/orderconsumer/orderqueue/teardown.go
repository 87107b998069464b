package orderqueue

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteTopology deletes what t names on broker, the dead letters too: the
// JetStream streams, or the RabbitMQ queues. What is missing already is no
// error.
func DeleteTopology(ctx context.Context, broker string, t Topology) error {
	kind, err := brokerKind(broker)
	if err != nil {
		return err
	}
	if kind == "nats" {
		nc, err := ConnectNATS(broker)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		for _, s := range []string{t.Stream, t.DeadLetterStream} {
			if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return err
			}
		}
		return nil
	}
	conn, err := amqp.Dial(broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range []string{t.Queue, t.DeadLetterQueue} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	return nil
}
