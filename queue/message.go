package queue

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Message is one delivery of a message, as its broker's front-end read it.
type Message struct {
	// ID is the broker's message id: JetStream's Nats-Msg-Id header,
	// AMQP's message_id property; "" when the publisher set none.
	ID string
	// Source is where the message came from: its subject or queue.
	Source string
	// Header holds the message's headers (an AMQP header table's values
	// written as text).
	Header map[string][]string
	// Body is the payload.
	Body []byte
	// ReplyTo is where the answer goes (the Reply-To header on NATS, the
	// reply_to property on AMQP); "" when the publisher wants none.
	ReplyTo string
	// CorrelationID ties a reply to its request (AMQP's correlation_id;
	// the message id when the publisher set none).
	CorrelationID string
	// Delivery counts this message's deliveries, 1 for the first
	// (JetStream's NumDelivered, a quorum queue's x-delivery-count + 1).
	Delivery int
}

// HeaderValue returns the first value of the header name, matched
// ignoring case (brokers keep header names as their publisher spelled
// them), and how many values the message carries under that name.
func (m *Message) HeaderValue(name string) (value string, n int) {
	for k, vs := range m.Header {
		if strings.EqualFold(k, name) {
			if n == 0 && len(vs) > 0 {
				value = vs[0]
			}
			n += len(vs)
		}
	}
	return value, n
}

// Delivery is one delivered message and the broker operations that settle
// it, implemented by each broker's front-end (packages idemnats and
// idemamqp). A Delivery is settled once: Ack, Nak or DeadLetter.
type Delivery interface {
	// Message returns the message.
	Message() *Message
	// Ack removes the message from its queue: it is done.
	Ack(ctx context.Context) error
	// Nak asks the broker to deliver the message again after delay.
	Nak(ctx context.Context, delay time.Duration) error
	// DeadLetter stores a copy of the message, with header added to its
	// own (the reason: DeadLetterHeaders), where dead letters are kept,
	// and then removes the message from its queue. It removes nothing
	// unless the broker confirmed the copy; without a dead-letter
	// destination it terminates the message (JetStream) or rejects it to
	// the queue's own dead-letter exchange (AMQP).
	DeadLetter(ctx context.Context, header map[string]string) error
	// Reply publishes r to the message's ReplyTo. Its error wraps
	// ErrUndeliverable when the broker refuses the reply for good; any
	// other error is taken for a passing failure, and the message is
	// delivered again to reply again.
	Reply(ctx context.Context, r Reply) error
}

// ErrUndeliverable is wrapped by a Delivery's Reply when the broker refuses
// the reply for good (a reply subject it cannot publish to, a reply queue
// that no longer exists): delivering the message again cannot change that,
// so the message is settled as decided and the lost reply logged and
// counted (Settlement.ReplyErr).
var ErrUndeliverable = errors.New("queue: the broker refuses it permanently")

// Reply is the answer to a message that asked for one: what the HTTP
// route of the same action answers, as a message.
type Reply struct {
	// Status is the answer's HTTP status, sent as the StatusHeader.
	Status int
	// Header is the answer's recorded metadata (Content-Type, Location).
	Header map[string][]string
	// Body is the answer's body: the order's JSON, or a problem's.
	Body []byte
	// Replayed marks the record's answer (ReplayedHeader: true), not this
	// delivery's run.
	Replayed bool
}

// Headers of the contract, on replies and dead letters.
const (
	// KeyHeader carries a message's idempotency key, as over HTTP.
	KeyHeader = "Idempotency-Key"
	// StatusHeader carries a reply's HTTP status.
	StatusHeader = "Status"
	// ReplayedHeader is "true" on a reply that replays the record.
	ReplayedHeader = "Idempotent-Replayed"

	// ReasonHeader says why a message was dead-lettered: the problem kind
	// (key-reused, invalid-body, …) or ReasonMaxDeliveries.
	ReasonHeader = "Dead-Letter-Reason"
	// DeadStatusHeader is the HTTP status of the answer that ended it.
	DeadStatusHeader = "Dead-Letter-Status"
	// DetailHeader is the answer's problem title and detail.
	DetailHeader = "Dead-Letter-Detail"
	// DeliveriesHeader is how many times it was delivered.
	DeliveriesHeader = "Dead-Letter-Deliveries"
	// SourceHeader is the subject or queue it came from.
	SourceHeader = "Dead-Letter-Source"
	// MessageIDHeader is its message id, if it had one: a dead letter
	// gets an id of its own, so that a broker's deduplication never drops
	// the dead letter of another message with the same id.
	MessageIDHeader = "Dead-Letter-Message-Id"
)

// ReasonMaxDeliveries is the ReasonHeader of a message whose handler kept
// failing until its delivery reached Config.MaxDeliveries.
const ReasonMaxDeliveries = "max-deliveries"
