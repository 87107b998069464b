package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// every message it took is settled; a message it had taken and not begun,
// whether waiting for a worker or still in the client's prefetch buffer,
// is negatively acked as soon as ctx ends, to be delivered again at once
// (after one request for the consumer's info, which may hold shutdown up
// to 5 s if the server does not answer: see forgetPullRequests).
// A lost connection is nats.go's to restore meanwhile (see
// nats.MaxReconnects).
func (c *Consumer) Run(ctx context.Context) error {
	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.cfg.Prefetch))
	if err != nil {
		return err
	}
	// Drain, not Stop: Stop drops the messages the client has already
	// pulled, and the server, which counts them delivered, would hold each
	// for AckWait before delivering it to anyone. Drained, they come out
	// of the iterator, to be naked.
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	in := make(chan queue.Delivery, c.cfg.Workers*c.cfg.BatchSize) // what a batch takes waits here
	ended := make(chan error, 1)
	go c.read(ctx, it, in, ended)
	// What waits for a worker is handed back once ctx ends and the
	// iterator is drained (read closes in), not once the workers finish
	// the batches they are doing.
	processed, handedBack := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(handedBack)
		select {
		case <-ctx.Done():
		case <-processed:
		}
		var waiting []queue.Delivery
		for d := range in {
			waiting = append(waiting, d)
		}
		for _, d := range waiting {
			_ = d.Nak(context.Background(), 0)
		}
	}()
	c.p.Run(ctx, in)
	close(processed)
	<-handedBack
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("idemnats: the consumer stopped: %w", <-ended)
}

// read hands the iterator's messages to the workers through in until the
// iterator ends, then closes in. Once ctx has ended it keeps the messages
// the drained iterator still yields instead, and naks them when it is
// done: the server delivers a message naked while this client's pull
// request still stands straight back to it, one more delivery counted.
// No message not begun is naked before forgetPullRequests (a worker may
// still nak its own, settling it): read's own naks come after it, and
// Run's hand-back of what waits in in only once in is closed, which read
// does last, so that Run, which waits for the hand-back, returns only once
// read's naks are sent too.
func (c *Consumer) read(ctx context.Context, it jetstream.MessagesContext, in chan<- queue.Delivery, ended chan<- error) {
	var notBegun []jetstream.Msg
	defer func() {
		if ctx.Err() != nil {
			c.forgetPullRequests()
		}
		for _, msg := range notBegun {
			_ = msg.Nak()
		}
		close(in)
	}()
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
		if ctx.Err() != nil {
			notBegun = append(notBegun, msg)
			continue
		}
		select {
		case in <- c.delivery(msg):
		case <-ctx.Done():
			notBegun = append(notBegun, msg)
		}
	}
}

// forgetPullRequests has the server drop the pull requests the drained
// iterator left standing, before the messages not begun are naked. The
// server keeps a pull request until it is filled or expires, or until it
// finds nobody subscribed to its reply subject, which it looks for only
// when it is about to deliver to it. A server before 2.10.16 (nats-server
// #5305, #5338) that takes a naked message off its redelivery queue and
// finds only such a pull request drops the request and gives up on the
// message until AckWait (before 2.10.14 it also delivers another message
// a second time, as if it were new): the first message naked on shutdown,
// with no other consumer's pull request waiting, would come back only
// after AckWait. The consumer's info drops every pull request whose reply
// subject has lost its subscriber; Drain has already unsubscribed ours
// (and flushed, so the server knows), and the server answers the info
// only once it has dropped them, so the naks sent after the answer find
// the pull requests still waiting all live, or none: a naked message then
// waits for the next pull request, of this consumer or another.
func (c *Consumer) forgetPullRequests() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.cons.Info(ctx); err != nil {
		c.cfg.Logger.Warn("idemnats: on shutdown, the consumer's info, which drops the pull requests left standing, failed; a server before 2.10.16 may hold the first message naked until AckWait", "err", err)
	}
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
		d.stream, d.seq, d.stored = meta.Stream, meta.Sequence.Stream, meta.Timestamp
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
	stored time.Time // when the stream stored the message
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
// message. The dead letter carries the message's own headers but none of
// the server's (Nats-*), whose publish guards (Nats-Expected-Stream, …)
// were the message's and would make the dead-letter stream refuse it; the
// message's id is kept as queue.MessageIDHeader. Its Nats-Msg-Id is
// deadLetterID: a message dead-lettered again after a lost Term is stored
// once.
func (d *delivery) DeadLetter(ctx context.Context, reason map[string]string) error {
	if d.c.cfg.DeadLetterSubject != "" {
		out := nats.NewMsg(d.c.cfg.DeadLetterSubject)
		for k, vs := range d.m.Header {
			if isServerHeader(k) || hasKeyFold(reason, k) {
				continue
			}
			out.Header[k] = append([]string(nil), vs...)
		}
		for k, v := range reason {
			out.Header.Set(k, v)
		}
		if d.stream != "" {
			out.Header.Set(nats.MsgIdHdr, d.deadLetterID())
		}
		out.Data = d.m.Body
		if _, err := d.c.js.PublishMsg(ctx, out); err != nil {
			return fmt.Errorf("idemnats: dead letter to %s: %w", d.c.cfg.DeadLetterSubject, err)
		}
	}
	return d.msg.Term()
}

// deadLetterID is the dead letter's Nats-Msg-Id: the message's stream,
// sequence and the time the stream stored it. The sequence alone repeats
// when a stream is deleted and created again, and the dead-letter stream
// would drop the new message's dead letter as a duplicate of the old
// one's; the stored time tells them apart, yet is the same on every
// delivery of one message.
func (d *delivery) deadLetterID() string {
	return "dead-letter:" + d.stream + ":" + strconv.FormatUint(d.seq, 10) + ":" + strconv.FormatInt(d.stored.UnixNano(), 10)
}

// isServerHeader reports whether a header is one of the server's own
// (Nats-Msg-Id, Nats-Expected-*, Nats-TTL, Nats-Rollup, …): a publish
// guard or instruction to the stream, never business data.
func isServerHeader(name string) bool {
	const prefix = "Nats-"
	return len(name) >= len(prefix) && strings.EqualFold(name[:len(prefix)], prefix)
}

// hasKeyFold reports whether h has the key name, ignoring case.
func hasKeyFold(h map[string]string, name string) bool {
	for k := range h {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// Reply publishes the answer to the Reply-To subject: the body, Status,
// the recorded Content-Type and Location, and Idempotent-Replayed on a
// replay. Over core NATS a reply is fire-and-forget: a subject nobody
// listens on is no failure. A subject no message can be published to,
// or a reply the server can never take (too large, no headers), is lost
// for good: the error wraps queue.ErrUndeliverable.
func (d *delivery) Reply(_ context.Context, r queue.Reply) error {
	if !publishable(d.m.ReplyTo) {
		return fmt.Errorf("idemnats: reply subject %q: %w: not a subject a message can be published to", d.m.ReplyTo, queue.ErrUndeliverable)
	}
	out := nats.NewMsg(d.m.ReplyTo)
	for k, vs := range r.Header {
		out.Header[k] = append([]string(nil), vs...)
	}
	out.Header.Set(queue.StatusHeader, strconv.Itoa(r.Status))
	if r.Replayed {
		out.Header.Set(queue.ReplayedHeader, "true")
	}
	out.Data = r.Body
	err := d.c.js.Conn().PublishMsg(out)
	if errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrHeadersNotSupported) {
		return fmt.Errorf("idemnats: reply to %q: %w: %w", d.m.ReplyTo, queue.ErrUndeliverable, err)
	}
	return err
}

// publishable reports whether subject is one a message can be published
// to: tokens that are neither empty nor a wildcard, and no whitespace.
// nats.go checks only the whitespace; a server that is not pedantic
// takes the rest without a word, drops a subject with an empty token and
// hands a wildcard's to whoever subscribed to a matching wildcard.
func publishable(subject string) bool {
	if subject == "" || strings.ContainsAny(subject, " \t\r\n") {
		return false
	}
	for token := range strings.SplitSeq(subject, ".") {
		if token == "" || token == "*" || token == ">" {
			return false
		}
	}
	return true
}
