package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderguard/idempotency/queue"
)

// ReplyToHeader names the subject a message's answer is published to: a
// JetStream message's own reply subject is its ack subject, so a
// publisher that wants the answer says where in this header.
const ReplyToHeader = "Reply-To"

// Config configures a Consumer.
type Config struct {
	queue.Config

	// DeadLetterSubject is where a message that can never be done is
	// published, with the reason in its headers (queue.ReasonHeader and
	// the others), before it is terminated: a subject that a stream
	// captures, since the dead letter counts as stored only once the
	// stream acknowledged it. Defaults to none: the message is terminated
	// and its reason only logged.
	DeadLetterSubject string

	// Prefetch is how many messages the client keeps buffered ahead of
	// the workers (jetstream.PullMaxMessages). Defaults to twice
	// Workers × BatchSize, at least 16.
	Prefetch int
}

// Consumer does a JetStream consumer's messages under the protocol.
type Consumer struct {
	js   jetstream.JetStream
	cons jetstream.Consumer
	cfg  Config
	p    *queue.Processor
}

// New returns a Consumer of cons's messages. cons should acknowledge
// explicitly and never give up on a message itself (MaxDeliver -1): the
// Consumer dead-letters a message after Config.MaxDeliveries, with the
// reason, which the server's own limit would drop silently.
func New(js jetstream.JetStream, cons jetstream.Consumer, cfg Config) (*Consumer, error) {
	info := cons.CachedInfo()
	source := info.Config.FilterSubject
	if source == "" {
		source = info.Stream
	}
	p, err := queue.New(source, cfg.Config)
	if err != nil {
		return nil, err
	}
	cfg.Config = p.Config()
	if cfg.Prefetch == 0 {
		cfg.Prefetch = max(16, 2*cfg.Workers*cfg.BatchSize)
	}
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("idemnats: consumer %s acknowledges %s: want explicit acks, so that nothing is acked before it committed", info.Name, info.Config.AckPolicy)
	}
	return &Consumer{js: js, cons: cons, cfg: cfg, p: p}, nil
}

// Run consumes until ctx ends, or the consumer is gone. It returns once
// every message it took is settled; a message it had taken and not begun
// is negatively acked, to be delivered again at once. A lost connection is
// nats.go's to restore meanwhile (see nats.MaxReconnects).
func (c *Consumer) Run(ctx context.Context) error {
	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.cfg.Prefetch))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	in := make(chan queue.Delivery, c.cfg.Workers*c.cfg.BatchSize) // what a batch takes waits here
	ended := make(chan error, 1)
	go func() {
		defer close(in)
		for {
			msg, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				ended <- err
				return
			}
			if err != nil {
				c.cfg.Logger.Warn("idemnats: consuming", "err", err)
				continue
			}
			d := c.delivery(msg)
			select {
			case in <- d:
			case <-ctx.Done():
				_ = msg.Nak()
			}
		}
	}()
	c.p.Run(ctx, in)
	it.Stop()
	for d := range in {
		_ = d.Nak(context.Background(), 0)
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("idemnats: the consumer stopped: %w", <-ended)
}

// delivery reads a JetStream message as the queue's.
func (c *Consumer) delivery(msg jetstream.Msg) *delivery {
	m := &queue.Message{Source: msg.Subject(), Header: msg.Headers(), Body: msg.Data(), Delivery: 1}
	m.ID, _ = m.HeaderValue(nats.MsgIdHdr)
	m.ReplyTo, _ = m.HeaderValue(ReplyToHeader)
	m.CorrelationID = m.ID
	d := &delivery{c: c, msg: msg, m: m}
	if meta, err := msg.Metadata(); err == nil {
		m.Delivery = int(meta.NumDelivered)
		d.stream, d.seq = meta.Stream, meta.Sequence.Stream
	}
	return d
}

var _ queue.Delivery = (*delivery)(nil)

// delivery is one JetStream message as a queue.Delivery.
type delivery struct {
	c      *Consumer
	msg    jetstream.Msg
	m      *queue.Message
	stream string
	seq    uint64
}

func (d *delivery) Message() *queue.Message { return d.m }

func (d *delivery) Ack(context.Context) error { return d.msg.Ack() }

func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return d.msg.Nak()
	}
	return d.msg.NakWithDelay(delay)
}

// DeadLetter publishes the message with the reason to the dead-letter
// subject, waits for the stream's acknowledgement, then terminates the
// message. The dead letter's Nats-Msg-Id is its stream and sequence: a
// message dead-lettered again after a lost Term is stored once.
func (d *delivery) DeadLetter(ctx context.Context, reason map[string]string) error {
	if d.c.cfg.DeadLetterSubject != "" {
		out := nats.NewMsg(d.c.cfg.DeadLetterSubject)
		for k, vs := range d.m.Header {
			out.Header[k] = append([]string(nil), vs...)
		}
		for k, v := range reason {
			out.Header.Set(k, v)
		}
		out.Header.Del(nats.MsgIdHdr)
		if d.stream != "" {
			out.Header.Set(nats.MsgIdHdr, "dead-letter:"+d.stream+":"+strconv.FormatUint(d.seq, 10))
		}
		out.Data = d.m.Body
		if _, err := d.c.js.PublishMsg(ctx, out); err != nil {
			return fmt.Errorf("idemnats: dead letter to %s: %w", d.c.cfg.DeadLetterSubject, err)
		}
	}
	return d.msg.Term()
}

// Reply publishes the answer to the Reply-To subject: the body, Status,
// the recorded Content-Type and Location, and Idempotent-Replayed on a
// replay.
func (d *delivery) Reply(_ context.Context, r queue.Reply) error {
	out := nats.NewMsg(d.m.ReplyTo)
	for k, vs := range r.Header {
		out.Header[k] = append([]string(nil), vs...)
	}
	out.Header.Set(queue.StatusHeader, strconv.Itoa(r.Status))
	if r.Replayed {
		out.Header.Set(queue.ReplayedHeader, "true")
	}
	out.Data = r.Body
	return d.c.js.Conn().PublishMsg(out)
}
