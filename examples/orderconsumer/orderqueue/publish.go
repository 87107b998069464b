package orderqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// Message is a create as a publisher sends it.
type Message struct {
	User   string            // X-User-ID; "" sends none
	Key    string            // Idempotency-Key; "" sends none
	ID     string            // Nats-Msg-Id or message_id; "" sends none
	Body   []byte            // the POST /orders body
	Header map[string]string // further headers
}

// Reply is a consumer's answer to a message that asked for one.
type Reply struct {
	Status int
	Header map[string]string // Content-Type, Location, Idempotent-Replayed
	Body   []byte
}

// Replayed reports a replay of the record.
func (r Reply) Replayed() bool { return r.Header[queue.ReplayedHeader] == "true" }

// Publisher publishes creates to the consumer's subject or queue.
type Publisher interface {
	// Publish sends m and returns once the broker stored it. duplicate
	// says JetStream dropped it as a copy of a Nats-Msg-Id within its
	// stream's Duplicates window.
	Publish(ctx context.Context, m Message) (duplicate bool, err error)
	// Send sends m asking for a reply, which the Pending returns.
	Send(ctx context.Context, m Message) (*Pending, error)
	Close() error
}

// Pending is a reply on its way.
type Pending struct {
	replies <-chan Reply
	close   func()
}

// Wait waits for the reply, or for ctx.
func (p *Pending) Wait(ctx context.Context) (Reply, error) {
	select {
	case r := <-p.replies:
		return r, nil
	case <-ctx.Done():
		return Reply{}, fmt.Errorf("orderqueue: no reply: %w", ctx.Err())
	}
}

// Close stops listening for the reply.
func (p *Pending) Close() { p.close() }

// Request sends m and waits for its reply.
func Request(ctx context.Context, pub Publisher, m Message) (Reply, error) {
	p, err := pub.Send(ctx, m)
	if err != nil {
		return Reply{}, err
	}
	defer p.Close()
	return p.Wait(ctx)
}

// Dial returns a publisher to t's subject (nats://) or queue (amqp://).
func Dial(broker string, t Topology) (Publisher, error) {
	kind, err := brokerKind(broker)
	if err != nil {
		return nil, err
	}
	if kind == "nats" {
		nc, err := ConnectNATS(broker)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &natsPublisher{nc: nc, js: js, subject: t.Subject}, nil
	}
	return dialAMQP(broker, t.Queue)
}

type natsPublisher struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
}

func (p *natsPublisher) msg(m Message) *nats.Msg {
	out := nats.NewMsg(p.subject)
	for k, v := range m.Header {
		out.Header.Set(k, v)
	}
	if m.User != "" {
		out.Header.Set(UserHeader, m.User)
	}
	if m.Key != "" {
		out.Header.Set(queue.KeyHeader, m.Key)
	}
	if m.ID != "" {
		out.Header.Set(nats.MsgIdHdr, m.ID)
	}
	out.Data = m.Body
	return out
}

func (p *natsPublisher) Publish(ctx context.Context, m Message) (bool, error) {
	ack, err := p.js.PublishMsg(ctx, p.msg(m))
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}

func (p *natsPublisher) Send(ctx context.Context, m Message) (*Pending, error) {
	inbox := p.nc.NewRespInbox()
	msgs := make(chan *nats.Msg, 8)
	sub, err := p.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return nil, err
	}
	out := p.msg(m)
	out.Header.Set(idemnats.ReplyToHeader, inbox)
	if _, err := p.js.PublishMsg(ctx, out); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	replies := make(chan Reply, 1)
	done := make(chan struct{})
	go func() {
		select {
		case msg := <-msgs:
			r := Reply{Body: msg.Data, Header: map[string]string{}}
			for k := range msg.Header {
				r.Header[k] = msg.Header.Get(k)
			}
			r.Status, _ = strconv.Atoi(r.Header[queue.StatusHeader])
			replies <- r
		case <-done:
		}
	}()
	var once sync.Once
	return &Pending{replies: replies, close: func() {
		once.Do(func() { close(done); _ = sub.Unsubscribe() })
	}}, nil
}

func (p *natsPublisher) Close() error {
	p.nc.Close()
	return nil
}

// amqpPublisher publishes with confirms and takes replies through
// RabbitMQ's direct reply-to, on one channel.
type amqpPublisher struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string

	mu      sync.Mutex
	waiting map[string]chan Reply
}

// directReplyTo is RabbitMQ's pseudo-queue for replies without a queue.
const directReplyTo = "amq.rabbitmq.reply-to"

func dialAMQP(url, queueName string) (*amqpPublisher, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	p := &amqpPublisher{conn: conn, queue: queueName, waiting: map[string]chan Reply{}}
	if p.ch, err = conn.Channel(); err == nil {
		err = p.ch.Confirm(false)
	}
	var replies <-chan amqp.Delivery
	if err == nil {
		replies, err = p.ch.Consume(directReplyTo, "", true, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	go p.dispatch(replies)
	return p, nil
}

func (p *amqpPublisher) dispatch(replies <-chan amqp.Delivery) {
	for d := range replies {
		r := Reply{Body: d.Body, Header: map[string]string{}}
		for k, v := range headerText(d.Headers) {
			r.Header[k] = v
		}
		if d.ContentType != "" {
			r.Header["Content-Type"] = d.ContentType
		}
		r.Status, _ = strconv.Atoi(r.Header[queue.StatusHeader])
		p.mu.Lock()
		c := p.waiting[d.CorrelationId]
		delete(p.waiting, d.CorrelationId)
		p.mu.Unlock()
		if c != nil {
			c <- r
		}
	}
}

func headerText(t amqp.Table) map[string]string {
	h := map[string]string{}
	for k, v := range t {
		if s, ok := v.(string); ok {
			h[k] = s
		} else {
			h[k] = fmt.Sprint(v)
		}
	}
	return h
}

func (p *amqpPublisher) publishing(m Message) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range m.Header {
		h[k] = v
	}
	if m.User != "" {
		h[UserHeader] = m.User
	}
	if m.Key != "" {
		h[queue.KeyHeader] = m.Key
	}
	return amqp.Publishing{Headers: h, MessageId: m.ID, ContentType: "application/json",
		DeliveryMode: amqp.Persistent, Body: m.Body}
}

func (p *amqpPublisher) publish(ctx context.Context, msg amqp.Publishing) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, false, false, msg)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("orderqueue: the broker refused the message (basic.nack)")
	}
	return err
}

func (p *amqpPublisher) Publish(ctx context.Context, m Message) (bool, error) {
	return false, p.publish(ctx, p.publishing(m))
}

func (p *amqpPublisher) Send(ctx context.Context, m Message) (*Pending, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	corr := hex.EncodeToString(b[:])
	replies := make(chan Reply, 1)
	p.mu.Lock()
	p.waiting[corr] = replies
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.waiting, corr)
		p.mu.Unlock()
	}
	msg := p.publishing(m)
	msg.ReplyTo, msg.CorrelationId = directReplyTo, corr
	if err := p.publish(ctx, msg); err != nil {
		forget()
		return nil, err
	}
	return &Pending{replies: replies, close: forget}, nil
}

func (p *amqpPublisher) Close() error { return p.conn.Close() }
