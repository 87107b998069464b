package orderqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	idemamqp "github.com/orderguard/idempotency/amqp"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// Run consumes svc's action opts.Action from opts.Broker until ctx ends,
// creating what opts.Topology names if it is missing (EnsureTopology).
func Run(ctx context.Context, svc *orderservice.Service, opts Options) error {
	kind, err := brokerKind(opts.Broker)
	if err != nil {
		return err
	}
	cfg := queue.Config{}
	if opts.Action == ActionPaymentEvents {
		if cfg, err = PaymentConfig(svc, opts); err != nil {
			return err
		}
	} else {
		cfg = Config(svc, opts)
	}
	if kind == "amqp" {
		if err := EnsureTopology(ctx, opts.Broker, opts.Topology); err != nil {
			return err
		}
		c, err := idemamqp.New(idemamqp.Config{
			Config: cfg, URL: opts.Broker, Queue: opts.Topology.Queue, QueueType: idemamqp.QuorumQueue,
			DeadLetterQueue: opts.Topology.DeadLetterQueue,
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
// which counts deliveries, with the arguments of ordersQueueArguments).
// It leaves out the JetStream consumer, which Run creates or updates with
// its AckWait. A queue that exists is used as it is: one declared by an
// earlier version of this example, without those arguments, keeps
// RabbitMQ 4's delivery limit of 20 until it is deleted and declared
// again, or a policy sets delivery-limit -1 and the dead-letter exchange.
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
		// The dead letters' queue first: the orders' queue routes to it.
		if err := idemamqp.DeclareQueue(conn, t.DeadLetterQueue, nil); err != nil {
			return fmt.Errorf("orderqueue: queue %s: %w", t.DeadLetterQueue, err)
		}
		if err := idemamqp.DeclareQueue(conn, t.Queue, ordersQueueArguments(conn.Properties, t)); err != nil {
			return fmt.Errorf("orderqueue: queue %s: %w", t.Queue, err)
		}
		return nil
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

// ordersQueueArguments are the orders' quorum queue's, on the broker whose
// connection properties are server. The consumer requeues a message
// without limit while another consumer holds its key or the database is
// down, and dead-letters it itself, with the reason, when its handler
// keeps failing (MaxDeliveries); a quorum queue's own delivery limit must
// not drop an order meanwhile. RabbitMQ 4 sets one by default (20
// deliveries, each requeue counted): -1 lifts it, but RabbitMQ 3 reads -1
// as a limit and drops a message on its first requeue, and has no limit
// unless one is set, so -1 is declared on RabbitMQ 4 and later only. And
// whatever limit still applies (a broker of unknown version, an
// operator's delivery-limit policy) moves the message to the dead
// letters' queue, through the queue's dead-letter exchange, with the
// broker's reason in x-death (delivery_limit), instead of dropping it.
func ordersQueueArguments(server amqp.Table, t Topology) amqp.Table {
	args := amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": t.DeadLetterQueue,
	}
	if major, ok := rabbitMQMajor(server); ok && major >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

// rabbitMQMajor is the major version RabbitMQ announces in its connection
// properties ("4.0.5": 4); ok is false for another product or a version it
// cannot read.
func rabbitMQMajor(server amqp.Table) (major int, ok bool) {
	product, _ := server["product"].(string)
	version, _ := server["version"].(string)
	if product != "RabbitMQ" {
		return 0, false
	}
	head, _, _ := strings.Cut(version, ".")
	major, err := strconv.Atoi(head)
	return major, err == nil
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
