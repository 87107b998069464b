package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

// Handler does one message's action in tx, the record's transaction (or,
// in a batch, the batch's): every write in tx, neither committing nor
// rolling it back. Its Result is in HTTP's terms (idempotency.Result): a
// 2xx commits with the record, a final status (a 4xx-like refusal,
// Config.IsFinalFunc) is recorded after a rollback, anything else rolls
// back and the message is delivered again.
//
// A handler may run more than once for one message: after a redelivery
// whose key was released, in ModeSinglePhase, or alone after its batch
// rolled back. Every effect it has must be in tx.
type Handler func(ctx context.Context, tx *sql.Tx, m *Message) idempotency.Result

// Config configures a Processor. Every field but Middleware and Handler
// has a default.
type Config struct {
	// Middleware runs the protocol: use the Middleware of the HTTP route
	// (or gRPC method) of the same action, so that a key is one action
	// whatever transport carries it. Required, unless Unprotected is set.
	Middleware *idempotency.Middleware

	// Handler does the action. Required.
	Handler Handler

	// Key returns a message's idempotency key. Defaults to the message's
	// KeyHeader (Idempotency-Key, one value, as valid as over HTTP), and
	// without one to its id (Nats-Msg-Id, message_id). A message with
	// neither, or an error, is dead-lettered (missing-key, invalid-key).
	Key func(m *Message) (string, error)

	// Scope returns the principal that owns a message's key, spelled one
	// way (see idempotency.Config.ScopeFunc). An error is dead-lettered
	// as scope-required (or as the *idempotency.Problem it wraps).
	// Defaults to ScopeHeader's value.
	Scope func(m *Message) (string, error)

	// ScopeHeader names the header that carries the scope when Scope is
	// nil; a message without exactly one, non-empty, is dead-lettered as
	// scope-required. Defaults to none: the empty scope, safe for a single
	// tenant only.
	ScopeHeader string

	// Route is the HTTP method and route of the same action, "POST
	// /orders": the fingerprint is the HTTP route's for the same
	// business fields (idempotency.NewJSONFingerprint). Defaults to the
	// Route of the Middleware's idempotency.Operation, whose path
	// parameters the payload's members of the same names fill in;
	// without one, to "POST /" and the source's name given to New. Leave
	// it unset when the Middleware declares an Operation.
	Route string

	// Fingerprint selects the payload's JSON fields that make two
	// messages the same action, as the HTTP route's. Defaults to the
	// Middleware's Operation's field lists, else the whole payload.
	// Leave it unset when the Middleware declares an Operation.
	Fingerprint idempotency.FingerprintConfig

	// FingerprintFunc replaces the JSON fingerprint, for payloads that are
	// not JSON. An error is dead-lettered as invalid-body.
	FingerprintFunc func(m *Message) (string, error)

	// Validate refuses a message before anything is claimed, as an HTTP
	// route's checks in front of the middleware do (a payload that does
	// not decode, a user_id that is not the principal's): the message is
	// dead-lettered with the *idempotency.Problem it returns (any other
	// error is invalid-body) and nothing is written. Defaults to none.
	Validate func(m *Message) error

	// KeyReusedFunc, when set, takes a message whose key the protocol
	// refused as reused with another payload (idempotency.ProblemKeyReused)
	// instead of dead-lettering it: for actions whose sender no refusal
	// can correct, such as a payment provider's event id arriving again
	// with another payload, which is recorded as an anomaly and done. It
	// returns the answer the message is settled by, decided as any other
	// answer (a 2xx acks the message, and is its reply); an error is a
	// fault of the infrastructure, and the message is delivered again
	// after RetryDelay. It runs outside the protocol, after the refusal,
	// and may run again for a redelivery of the message: make it
	// idempotent. Defaults to none: dead-lettered as key-reused.
	KeyReusedFunc func(ctx context.Context, m *Message, refused idempotency.Answer) (idempotency.Answer, error)

	// MaxDeliveries dead-letters a message whose handler failed on its
	// MaxDeliveries-th delivery. Deliveries that met a key in progress or
	// a fault of the infrastructure count too, but never dead-letter a
	// message themselves. Defaults to 5.
	MaxDeliveries int

	// RetryDelay is how long a message waits before its next delivery
	// when another consumer holds its key, or the database or the broker
	// failed. Defaults to the Middleware's RetryAfter (1s).
	RetryDelay time.Duration

	// Backoff delays the next delivery of a message whose handler failed.
	// Defaults to 1s, doubling to at most 1m.
	Backoff Backoff

	// BatchSize is how many messages at most are done in one transaction
	// (idempotency.Middleware.DoBatch). Defaults to 1: one by one.
	BatchSize int

	// Workers is how many messages (or batches) are done at once.
	// Defaults to 4.
	Workers int

	// Unprotected, when set, does every message without the protocol:
	// the handler in a plain transaction of this database, committed on
	// a 2xx, per message or per batch. A redelivered message runs again.
	// It is the baseline that benchmarks compare the protocol with.
	Unprotected *sql.DB

	// BeforeSettle, when set, is called after a message's answer was
	// decided (and its run committed) and before the message is settled
	// with its broker: the fault tests cut connections and kill processes
	// there. Defaults to none.
	BeforeSettle func(s Settlement)

	// Observe, when set, receives every settlement once it is done.
	// Defaults to none.
	Observe func(s Settlement)

	// Logger receives a line for every dead letter and every failure to
	// settle a message. Defaults to discarding.
	Logger *slog.Logger
}

// Backoff is an exponential delay by delivery: Initial for the first
// delivery, doubling with each, at most Max.
type Backoff struct {
	Initial time.Duration // Defaults to 1s.
	Max     time.Duration // Defaults to 1m.
}

// Delay is the delay after the delivery-th delivery failed.
func (b Backoff) Delay(delivery int) time.Duration {
	d := b.Initial
	for i := 1; i < delivery && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

func (c Config) withDefaults(source string) Config {
	if c.Key == nil {
		c.Key = keyFromHeaderOrID(c.Middleware)
	}
	if c.Scope == nil {
		header := c.ScopeHeader
		c.Scope = func(m *Message) (string, error) {
			if header == "" {
				return "", nil
			}
			v, n := m.HeaderValue(header)
			if n != 1 || v == "" {
				return "", fmt.Errorf("send exactly one %s header", header)
			}
			return v, nil
		}
	}
	if c.Route == "" && c.Middleware != nil && c.Middleware.Config().Operation != nil {
		c.Route = c.Middleware.Config().Operation.Route
	} else if c.Route == "" {
		c.Route = "POST /" + source
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = 5
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
		if c.Middleware != nil {
			c.RetryDelay = c.Middleware.Config().RetryAfter
		}
	}
	if c.Backoff.Initial == 0 {
		c.Backoff.Initial = time.Second
	}
	if c.Backoff.Max == 0 {
		c.Backoff.Max = time.Minute
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Middleware == nil && c.Unprotected == nil:
		return errors.New("queue: Config.Middleware is required")
	case c.Handler == nil:
		return errors.New("queue: Config.Handler is required")
	case c.MaxDeliveries < 1:
		return fmt.Errorf("queue: MaxDeliveries %d: want at least 1", c.MaxDeliveries)
	case c.RetryDelay < 0 || c.Backoff.Initial < 0 || c.Backoff.Max < c.Backoff.Initial:
		return errors.New("queue: RetryDelay and Backoff must not be negative, and Backoff.Max not below Backoff.Initial")
	case c.BatchSize < 1 || c.Workers < 1:
		return errors.New("queue: BatchSize and Workers must be at least 1")
	}
	if c.Middleware != nil && c.Middleware.Config().Operation != nil {
		op := c.Middleware.Config().Operation
		if c.Route != op.Route || len(c.Fingerprint.Fields)+len(c.Fingerprint.IgnoreFields) > 0 {
			return fmt.Errorf("queue: the Middleware declares the action (Operation %q): leave Route and Fingerprint unset", op.Route)
		}
	}
	verb, route, ok := strings.Cut(c.Route, " ")
	if !ok || verb == "" || !strings.HasPrefix(route, "/") {
		return fmt.Errorf("queue: Route %q: want an HTTP method and route, \"POST /orders\"", c.Route)
	}
	return nil
}

// keyFromHeaderOrID is the default Config.Key: the key header, parsed as
// over HTTP, else the message's id. One empty key header is no key, as
// over HTTP, where one of only spaces and tabs arrives empty too (HTTP/1.1
// strips the optional whitespace around a value, and so does NATS before
// a value): a publisher that always sets the header, empty when it has no
// key, gets its message id as the key, not a dead letter.
func keyFromHeaderOrID(mw *idempotency.Middleware) func(m *Message) (string, error) {
	header, maxLen := KeyHeader, 255
	if mw != nil {
		header, maxLen = mw.Config().HeaderName, mw.Config().MaxKeyLength
	}
	return func(m *Message) (string, error) {
		v, n := m.HeaderValue(header)
		switch {
		case n > 1:
			return "", fmt.Errorf("%w: send exactly one %s header", idempotency.ErrInvalidKey, header)
		case n == 1 && strings.Trim(v, " \t") != "":
			return idempotency.ParseKey(v, maxLen)
		case len(m.ID) > maxLen:
			return "", fmt.Errorf("%w: the message id has %d bytes, more than %d", idempotency.ErrInvalidKey, len(m.ID), maxLen)
		case m.ID != "":
			return m.ID, nil
		}
		return "", idempotency.ErrMissingKey
	}
}

// scopeProblem is a Scope error as the protocol answers it.
func scopeProblem(err error) *idempotency.Problem {
	var p *idempotency.Problem
	if errors.As(err, &p) {
		return p
	}
	return idempotency.NewProblem(http.StatusUnauthorized, idempotency.ProblemScopeRequired, "Unauthenticated", err.Error())
}
