// Package orderqueue serves the example order service's create from a
// queue: message bodies identical to POST /orders, from NATS JetStream
// (stream ORDERS, subject orders.create) or RabbitMQ (queue
// orders.create), each made exactly one order by the service's own
// create_order Middleware, so that one key is one action whether it came
// over HTTP, gRPC or a queue.
//
// Headers: X-User-ID is the principal (a positive integer, as over HTTP),
// Idempotency-Key the key (falling back to the message id: Nats-Msg-Id,
// message_id). A message that asks for a reply (NATS: the Reply-To header;
// AMQP: reply_to) gets the HTTP answer's JSON with a Status header.
//
// It serves the service's cancel (ActionCancel) and payment providers'
// events (ActionPaymentEvents, PaymentConfig: Standard Webhooks bodies an
// event bridge forwards, the same action as the service's payment webhook,
// keyed by the event id) in the same way.
package orderqueue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/queue"
)

// UserHeader carries the principal.
const UserHeader = "X-User-ID"

// Topology names what the consumer reads and where its dead letters go.
type Topology struct {
	// NATS JetStream: the stream and the subject it captures, the durable
	// consumer, and the dead letters' stream and subject.
	Stream, Subject, Durable            string
	DeadLetterStream, DeadLetterSubject string
	// RabbitMQ: the queue and the dead letters' queue.
	Queue, DeadLetterQueue string
}

// DefaultTopology is the example's: stream ORDERS on orders.create
// (durable consumer orderconsumer), dead letters on
// orders.create.dead-letter (stream ORDERS_DEAD_LETTER); the queue
// orders.create and orders.create.dead-letter.
func DefaultTopology() Topology {
	return NamedTopology("ORDERS", "orders.create", "orderconsumer", "orders.create")
}

// NamedTopology is a topology of these names, its dead letters named after
// them: stream_DEAD_LETTER on subject.dead-letter, queue.dead-letter.
func NamedTopology(stream, subject, durable, queue string) Topology {
	return Topology{
		Stream: stream, Subject: subject, Durable: durable,
		DeadLetterStream: stream + "_DEAD_LETTER", DeadLetterSubject: subject + ".dead-letter",
		Queue: queue, DeadLetterQueue: queue + ".dead-letter",
	}
}

// The service's actions a consumer serves, by their operation's name
// (orderservice.CreateOperation, CancelOperation).
const (
	// ActionCreate: a body as POST /orders's.
	ActionCreate = "create_order"
	// ActionCancel: {"order_no": "…"}, POST /orders/{order_no}/cancel.
	ActionCancel = "cancel_order"
)

// ActionPaymentEvents, the third, is in payments.go.

// Options configure a consumer of the order service.
type Options struct {
	// Action is the service's action the messages carry: ActionCreate,
	// ActionCancel or ActionPaymentEvents. Defaults to ActionCreate.
	Action string

	// WebhookSecrets are the Standard Webhooks signing secrets
	// ("whsec_<base64>") that ActionPaymentEvents verifies messages with,
	// the webhook's own: while one is rolled, list both. Required for
	// ActionPaymentEvents, unused otherwise. Defaults to none.
	WebhookSecrets []string

	// WebhookTolerance, when set, is how far a payment event's
	// webhook-timestamp may be from Now, either way; further is
	// dead-lettered as ReasonStale. Defaults to none: a queued event is
	// checked for its signature only. A queue delivers at least once and
	// keeps a backlog while a consumer or the database is down, so a
	// clock check would dead-letter genuine payments that merely waited;
	// a replayed copy is harmless anyway, since its event id is its key.
	WebhookTolerance time.Duration

	// Now is the clock payment events' timestamps are checked against.
	// Defaults to time.Now.
	Now func() time.Time

	// Broker is nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/.
	Broker   string
	Topology Topology

	// Workers, BatchSize, MaxDeliveries, RetryDelay and Backoff are
	// queue.Config's (defaults: 4, 1, 5, the Middleware's RetryAfter,
	// 1s..1m).
	Workers, BatchSize, MaxDeliveries int
	RetryDelay                        time.Duration
	Backoff                           queue.Backoff

	// AckWait is the JetStream consumer's: how long a delivery stays
	// unacked before the server delivers it again. Defaults to 30s.
	AckWait time.Duration

	// Unprotected, when set, consumes without the protocol, in plain
	// transactions of this database (the service must be built without
	// Idempotency): the benchmarks' baseline.
	Unprotected *sql.DB

	// BeforeSettle and Observe are queue.Config's hooks.
	BeforeSettle, Observe func(queue.Settlement)

	Logger *slog.Logger
}

// Config is the queue configuration of svc's action opts.Action: its
// Middleware, whose Operation is the HTTP route's action (the same
// fingerprint for the same business fields), the principal from X-User-ID
// as the scope, and the HTTP route's checks in front (Validate).
// ActionPaymentEvents's is PaymentConfig's, which reports a configuration
// error (no secret): Config then returns one that queue.New refuses, so
// call PaymentConfig for that action to learn why.
func Config(svc *orderservice.Service, opts Options) queue.Config {
	if opts.Action == ActionPaymentEvents {
		cfg, _ := PaymentConfig(svc, opts)
		return cfg
	}
	handler, check := Handler(svc), validate
	if opts.Action == ActionCancel {
		handler, check = cancelHandler(svc), validateCancel
	} else {
		opts.Action = ActionCreate
	}
	return queue.Config{
		Middleware: svc.Middleware(opts.Action), Handler: handler,
		Scope: scope, Validate: check,
		Workers:       opts.Workers,
		BatchSize:     opts.BatchSize,
		MaxDeliveries: opts.MaxDeliveries,
		RetryDelay:    opts.RetryDelay,
		Backoff:       opts.Backoff,
		Unprotected:   opts.Unprotected,
		BeforeSettle:  opts.BeforeSettle,
		Observe:       opts.Observe,
		Logger:        opts.Logger,
	}
}

// Handler creates the message's order in tx with orderservice.Create,
// answered as POST /orders answers.
func Handler(svc *orderservice.Service) queue.Handler {
	return func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
		uid, err := principal(m)
		if err != nil {
			return result(orderservice.Reply{Problem: err.(*idempotency.Problem)})
		}
		var req orderservice.CreateRequest
		if err := json.Unmarshal(m.Body, &req); err != nil {
			return result(orderservice.Reply{Problem: invalidBody(err.Error())})
		}
		return result(svc.Create(ctx, tx, uid, req))
	}
}

// cancelRequest is a cancel's body: the order, as the path of POST
// /orders/{order_no}/cancel names it.
type cancelRequest struct {
	OrderNo string `json:"order_no"`
}

// cancelHandler cancels the message's order in tx with
// orderservice.Service.Cancel (the payment state machine's cancel request,
// as the HTTP route's), answered as POST
// /orders/{order_no}/cancel answers.
func cancelHandler(svc *orderservice.Service) queue.Handler {
	return func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
		uid, err := principal(m)
		if err != nil {
			return result(orderservice.Reply{Problem: err.(*idempotency.Problem)})
		}
		var req cancelRequest
		if err := json.Unmarshal(m.Body, &req); err != nil {
			return result(orderservice.Reply{Problem: invalidBody(err.Error())})
		}
		return result(svc.Cancel(ctx, tx, uid, req.OrderNo))
	}
}

// validateCancel is the cancel route's checks: a principal, and a body
// that names an order.
func validateCancel(m *queue.Message) error {
	if _, err := principal(m); err != nil {
		return err
	}
	var req cancelRequest
	if err := json.Unmarshal(m.Body, &req); err != nil || req.OrderNo == "" {
		return invalidBody(`body must be a JSON object {"order_no": "…"}`)
	}
	return nil
}

// result is a Reply as the record keeps it: the HTTP answer's status,
// Content-Type, Location and body.
func result(r orderservice.Reply) idempotency.Result {
	ct, body := r.Body()
	h := map[string][]string{"Content-Type": {ct}}
	for k, v := range r.Header {
		h[k] = v
	}
	if r.Problem != nil && r.Problem.RetryAfter > 0 {
		h["Retry-After"] = []string{strconv.Itoa(r.Problem.RetryAfter)}
	}
	return idempotency.Result{Status: r.StatusCode(), Header: h, Body: body}
}

// maxBody is POST /orders's body limit (orderservice.CheckCreate).
const maxBody = 64 << 10

// validate is POST /orders's checks before the key is claimed: a
// principal (401), a body within 64 KiB (413) that decodes as a create
// request (400) for that principal (orderservice.ValidateCreate: 400, 403).
func validate(m *queue.Message) error {
	uid, err := principal(m)
	if err != nil {
		return err
	}
	if len(m.Body) > maxBody {
		return idempotency.NewProblem(http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge,
			"Request body too large", "the message is over 64 KiB")
	}
	var req orderservice.CreateRequest
	if err := json.Unmarshal(m.Body, &req); err != nil {
		return invalidBody("body must be a JSON object {user_id, sku_id, quantity, coupon_id?}: " + err.Error())
	}
	if p := orderservice.ValidateCreate(uid, req); p != nil {
		return p
	}
	return nil
}

// principal is X-User-ID, parsed as the HTTP example parses it.
func principal(m *queue.Message) (int64, error) {
	v, n := m.HeaderValue(UserHeader)
	uid, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if n != 1 || err != nil || uid <= 0 {
		return 0, idempotency.NewProblem(http.StatusUnauthorized, idempotency.ProblemScopeRequired,
			"Unauthenticated", "Send X-User-ID: a positive integer.")
	}
	return uid, nil
}

// scope is the principal in canonical decimal, as over HTTP and gRPC.
func scope(m *queue.Message) (string, error) {
	uid, err := principal(m)
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(uid, 10), nil
}

func invalidBody(detail string) *idempotency.Problem {
	return idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body", detail)
}

// ErrUnknownBroker is a -broker URL of neither kind.
var ErrUnknownBroker = errors.New("orderqueue: the broker URL must start with nats:// or amqp:// (amqps://)")

// brokerKind is "nats" or "amqp".
func brokerKind(url string) (string, error) {
	switch {
	case strings.HasPrefix(url, "nats://"), strings.HasPrefix(url, "tls://"):
		return "nats", nil
	case strings.HasPrefix(url, "amqp://"), strings.HasPrefix(url, "amqps://"):
		return "amqp", nil
	}
	return "", ErrUnknownBroker
}
