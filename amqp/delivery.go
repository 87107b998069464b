package idemamqp

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/orderguard/idempotency/queue"
)

// session is one connection's state: the confirming channel replies and
// dead letters are published on, and the deliveries held for a delayed
// nack.
type session struct {
	c   *Consumer
	pub *publisher

	mu       sync.Mutex
	held     map[*time.Timer]amqp.Delivery
	released bool
}

// delivery reads an AMQP delivery as the queue's.
func (s *session) delivery(d amqp.Delivery) *delivery {
	m := &queue.Message{
		ID: d.MessageId, Source: s.c.cfg.Queue, Header: headerOf(d.Headers), Body: d.Body,
		ReplyTo: d.ReplyTo, CorrelationID: d.CorrelationId,
	}
	if d.ContentType != "" {
		m.Header["Content-Type"] = []string{d.ContentType}
	}
	if m.CorrelationID == "" {
		m.CorrelationID = d.MessageId
	}
	out := &delivery{s: s, d: d, m: m, id: countID(s.c.cfg.Config, m)}
	m.Delivery = s.c.counts.seen(s.c.cfg.QueueType, out.id, d)
	return out
}

var _ queue.Delivery = (*delivery)(nil)

// delivery is one AMQP delivery as a queue.Delivery.
type delivery struct {
	s  *session
	d  amqp.Delivery
	m  *queue.Message
	id string // what its deliveries are counted by
}

func (d *delivery) Message() *queue.Message { return d.m }

func (d *delivery) Ack(context.Context) error {
	d.s.c.counts.forget(d.id)
	return d.d.Ack(false)
}

// Nak holds the delivery for delay, then rejects it with requeue: AMQP
// has no delayed requeue, and holding it keeps it from every consumer
// meanwhile, as a JetStream NakWithDelay does. A delivery held when the
// session ends is requeued then.
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return d.d.Nack(false, true)
	}
	return d.s.hold(d.d, delay)
}

// DeadLetter publishes the message with the reason to the dead-letter
// queue, mandatory, waits for the broker's confirm, then acks the
// delivery. A dead letter the broker returned (the queue was deleted, or
// expired, since the session declared it) is an error, as a nack is: the
// message stays in its queue. The dead letter keeps the message's
// headers but the broker's counters (x-delivery-count, x-death and the
// others, brokerHeader): moved back to its queue after a fix, it is a
// message on its first delivery.
func (d *delivery) DeadLetter(ctx context.Context, reason map[string]string) error {
	cfg := d.s.c.cfg
	if cfg.DeadLetterQueue == "" {
		d.s.c.counts.forget(d.id)
		return d.d.Reject(false)
	}
	h := amqp.Table{}
	for k, v := range d.d.Headers {
		if !brokerHeader(k) {
			h[k] = v
		}
	}
	for k, v := range reason {
		h[k] = v
	}
	if err := d.s.pub.publish(ctx, cfg.DeadLetterQueue, true, amqp.Publishing{
		Headers: h, ContentType: d.d.ContentType, ContentEncoding: d.d.ContentEncoding,
		DeliveryMode: amqp.Persistent, CorrelationId: d.d.CorrelationId, MessageId: d.d.MessageId,
		Timestamp: d.d.Timestamp, Type: d.d.Type, AppId: d.d.AppId, Body: d.d.Body,
	}); err != nil {
		return fmt.Errorf("idemamqp: dead letter to %s: %w", cfg.DeadLetterQueue, err)
	}
	d.s.c.counts.forget(d.id)
	return d.d.Ack(false)
}

// Reply publishes the answer to reply_to through the default exchange,
// mandatory, with the request's correlation_id (its message_id if it had
// none), the Status header, the recorded Content-Type and Location, and
// Idempotent-Replayed on a replay; it waits for the broker's confirm. A
// reply the broker returned (its queue is gone: the client went away)
// wraps queue.ErrUndeliverable, as no redelivery can deliver it; a nack
// or a lost channel does not. A reply to the direct reply-to
// pseudo-queue (amq.rabbitmq.reply-to) is not mandatory: RabbitMQ returns
// those whether or not it delivered them.
func (d *delivery) Reply(ctx context.Context, r queue.Reply) error {
	h := amqp.Table{queue.StatusHeader: strconv.Itoa(r.Status)}
	contentType := ""
	for k, vs := range r.Header {
		switch {
		case len(vs) == 0:
		case k == "Content-Type":
			contentType = vs[0]
		default:
			h[k] = vs[0]
		}
	}
	if r.Replayed {
		h[queue.ReplayedHeader] = "true"
	}
	return undeliverable(d.s.pub.publish(ctx, d.m.ReplyTo, !directReplyTo(d.m.ReplyTo), amqp.Publishing{
		Headers: h, ContentType: contentType, CorrelationId: d.m.CorrelationID, Body: r.Body,
	}))
}

// hold requeues d after delay, or when the session ends.
func (s *session) hold(d amqp.Delivery, delay time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return d.Nack(false, true)
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		s.mu.Lock()
		_, mine := s.held[t]
		delete(s.held, t)
		s.mu.Unlock()
		if mine {
			_ = d.Nack(false, true)
		}
	})
	s.held[t] = d
	return nil
}

// releaseHeld requeues every held delivery at once.
func (s *session) releaseHeld() {
	s.mu.Lock()
	held := s.held
	s.held, s.released = nil, true
	s.mu.Unlock()
	for t, d := range held {
		if t.Stop() {
			_ = d.Nack(false, true)
		}
	}
}

// headerOf writes an AMQP header table's values as text.
func headerOf(t amqp.Table) map[string][]string {
	h := make(map[string][]string, len(t)+1)
	for k, v := range t {
		switch v := v.(type) {
		case []any:
			for _, e := range v {
				h[k] = append(h[k], text(e))
			}
		default:
			h[k] = []string{text(v)}
		}
	}
	return h
}

func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}
