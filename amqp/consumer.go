package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/orderguard/idempotency/queue"
)

// Config configures a Consumer.
type Config struct {
	queue.Config

	// URL is the broker's, "amqp://guest:guest@127.0.0.1:5672/".
	// Required.
	URL string

	// Queue is the queue consumed. Required; it must exist (see
	// DeclareQueue).
	Queue string

	// QueueType is Queue's type, which says who counts a message's
	// deliveries (queue.Message.Delivery, against MaxDeliveries): on a
	// QuorumQueue, the broker's x-delivery-count, across consumers and
	// restarts; on a ClassicQueue, this Consumer, by the message's key,
	// so that MaxDeliveries is then per consumer process, and an
	// x-delivery-count, which only a publisher can have set there, is
	// ignored. AMQP 0-9-1 cannot tell a queue's type: set QuorumQueue for
	// a quorum queue (ClassicQueue on one dead-letters a message later
	// than MaxDeliveries says, never sooner). Defaults to ClassicQueue.
	QueueType QueueType

	// DeadLetterQueue receives a message that can never be done, with the
	// reason in its headers (queue.ReasonHeader and the others), through
	// the default exchange; the message is acked only once the broker
	// confirmed the dead letter in that queue. It is declared durable if
	// missing when a session starts; if it is deleted (or expires) later,
	// the broker returns the dead letters and their messages stay in
	// Queue, delivered again after RetryDelay, until it exists again.
	// Defaults to none: the message is rejected without requeue, to the
	// queue's own dead-letter exchange if it has one, and its reason only
	// logged.
	DeadLetterQueue string

	// Prefetch is how many unacked deliveries the broker sends ahead
	// (basic.qos): the batches are taken from them, and a delivery held
	// for a delayed nack holds one. Defaults to twice Workers ×
	// BatchSize, at least 16.
	Prefetch int

	// ReconnectDelay is the pause before dialling again after the
	// connection was lost. Defaults to 1s.
	ReconnectDelay time.Duration

	// Dial opens a connection. Defaults to amqp.Dial.
	Dial func(url string) (*amqp.Connection, error)
}

// Consumer does a queue's messages under the protocol.
type Consumer struct {
	cfg    Config
	p      *queue.Processor
	counts *deliveryCounts
}

// New returns a Consumer with cfg.
func New(cfg Config) (*Consumer, error) {
	if cfg.URL == "" || cfg.Queue == "" {
		return nil, errors.New("idemamqp: Config.URL and Config.Queue are required")
	}
	switch cfg.QueueType {
	case "":
		cfg.QueueType = ClassicQueue
	case ClassicQueue, QuorumQueue:
	default:
		return nil, fmt.Errorf("idemamqp: Config.QueueType %q: want %q or %q", cfg.QueueType, ClassicQueue, QuorumQueue)
	}
	p, err := queue.New(cfg.Queue, cfg.Config)
	if err != nil {
		return nil, err
	}
	cfg.Config = p.Config()
	if cfg.Prefetch == 0 {
		cfg.Prefetch = max(16, 2*cfg.Workers*cfg.BatchSize)
	}
	if cfg.ReconnectDelay == 0 {
		cfg.ReconnectDelay = time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = amqp.Dial
	}
	return &Consumer{cfg: cfg, p: p, counts: newDeliveryCounts()}, nil
}

// Run consumes until ctx ends, dialling again after every lost
// connection (the broker requeues what was not acked). It returns once
// every delivery it took is settled: a delivery taken and not begun, or
// held for a delayed nack, is negatively acked with requeue at once.
func (c *Consumer) Run(ctx context.Context) error {
	for {
		err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.cfg.Logger.Warn("idemamqp: connection lost; dialling again", "queue", c.cfg.Queue, "err", err,
			"in", c.cfg.ReconnectDelay.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.cfg.ReconnectDelay):
		}
	}
}

// DeclareQueue declares the queue name durable, with args (a quorum
// queue: {"x-queue-type": "quorum"}, and then Config.QueueType
// QuorumQueue), unless it exists: an existing queue is used as it is,
// whatever its arguments.
func DeclareQueue(conn *amqp.Connection, name string, args amqp.Table) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err == nil {
		return ch.Close()
	}
	// The failed passive declare closed that channel.
	if ch, err = conn.Channel(); err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(name, true, false, false, false, args)
	return err
}

// session consumes over one connection until it is lost or ctx ends.
func (c *Consumer) session(ctx context.Context) error {
	conn, err := c.cfg.Dial(c.cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	lost := conn.NotifyClose(make(chan *amqp.Error, 1))
	if c.cfg.DeadLetterQueue != "" {
		if err := DeclareQueue(conn, c.cfg.DeadLetterQueue, nil); err != nil {
			return fmt.Errorf("idemamqp: dead-letter queue %s: %w", c.cfg.DeadLetterQueue, err)
		}
	}
	sub, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := sub.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	pub, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := pub.Confirm(false); err != nil {
		return err
	}
	const tag = "idemamqp"
	deliveries, err := sub.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("idemamqp: consume %s: %w", c.cfg.Queue, err)
	}
	s := &session{c: c, pub: newPublisher(pub), held: map[*time.Timer]amqp.Delivery{}}
	stop := context.AfterFunc(ctx, func() { _ = sub.Cancel(tag, false) })
	defer stop()
	in := make(chan queue.Delivery, c.cfg.Workers*c.cfg.BatchSize) // what a batch takes waits here
	go func() {
		defer close(in)
		for d := range deliveries {
			select {
			case in <- s.delivery(d):
			case <-ctx.Done():
				_ = d.Nack(false, true)
			}
		}
	}()
	c.p.Run(ctx, in)
	for d := range in { // taken from the broker, not begun
		_ = d.Nak(context.Background(), 0)
	}
	s.releaseHeld()
	select {
	case err := <-lost:
		if err != nil {
			return err
		}
		return errors.New("idemamqp: connection closed")
	default:
		return ctx.Err()
	}
}
