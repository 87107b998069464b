package orderqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	idemamqp "github.com/orderguard/idempotency/amqp"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemnats "github.com/orderguard/idempotency/nats"
)

// Run consumes svc's creates from opts.Broker until ctx ends, creating
// what opts.Topology names if it is missing (EnsureTopology).
func Run(ctx context.Context, svc *orderservice.Service, opts Options) error {
	kind, err := brokerKind(opts.Broker)
	if err != nil {
		return err
	}
	cfg := Config(svc, opts)
	if kind == "amqp" {
		if err := EnsureTopology(ctx, opts.Broker, opts.Topology); err != nil {
			return err
		}
		c, err := idemamqp.New(idemamqp.Config{
			Config: cfg, URL: opts.Broker, Queue: opts.Topology.Queue, DeadLetterQueue: opts.Topology.DeadLetterQueue,
		})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	nc, err := ConnectNATS(opts.Broker)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := ensureJetStream(ctx, js, opts.Topology, opts.AckWait)
	if err != nil {
		return err
	}
	c, err := idemnats.New(js, cons, idemnats.Config{Config: cfg, DeadLetterSubject: opts.Topology.DeadLetterSubject})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// ConnectNATS connects as the example does: reconnecting for as long as
// it takes, so that a broker restart is a pause.
func ConnectNATS(url string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name("orderconsumer"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(false))
}

// EnsureTopology creates what t names on broker unless it exists: the
// JetStream streams (file storage) of the orders and of their dead
// letters, or the durable RabbitMQ queues (a quorum queue for the orders,
// which counts deliveries). It leaves out the JetStream consumer, which
// Run creates or updates with its AckWait.
func EnsureTopology(ctx context.Context, broker string, t Topology) error {
	kind, err := brokerKind(broker)
	if err != nil {
		return err
	}
	if kind == "amqp" {
		conn, err := amqp.Dial(broker)
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := idemamqp.DeclareQueue(conn, t.Queue, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return fmt.Errorf("orderqueue: queue %s: %w", t.Queue, err)
		}
		return idemamqp.DeclareQueue(conn, t.DeadLetterQueue, nil)
	}
	nc, err := ConnectNATS(broker)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	return ensureStreams(ctx, js, t)
}

func ensureStreams(ctx context.Context, js jetstream.JetStream, t Topology) error {
	for _, s := range []jetstream.StreamConfig{
		{Name: t.Stream, Subjects: []string{t.Subject}, Storage: jetstream.FileStorage},
		{Name: t.DeadLetterStream, Subjects: []string{t.DeadLetterSubject}, Storage: jetstream.FileStorage},
	} {
		_, err := js.Stream(ctx, s.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(ctx, s)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				err = nil // another consumer created it meanwhile
			}
		}
		if err != nil {
			return fmt.Errorf("orderqueue: stream %s: %w", s.Name, err)
		}
	}
	return nil
}

// ensureJetStream creates the streams if missing and creates or updates
// the durable consumer: explicit acks, no server-side delivery limit (the
// consumer dead-letters with the reason), ackWait (30s by default).
func ensureJetStream(ctx context.Context, js jetstream.JetStream, t Topology, ackWait time.Duration) (jetstream.Consumer, error) {
	if err := ensureStreams(ctx, js, t); err != nil {
		return nil, err
	}
	if ackWait == 0 {
		ackWait = 30 * time.Second
	}
	return js.CreateOrUpdateConsumer(ctx, t.Stream, jetstream.ConsumerConfig{
		Durable: t.Durable, FilterSubject: t.Subject, AckPolicy: jetstream.AckExplicitPolicy,
		MaxDeliver: -1, AckWait: ackWait, MaxAckPending: 4096,
	})
}
