package orderqueue

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/payment"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	"github.com/orderguard/idempotency/queue"
)

// ActionPaymentEvents: a payment provider's Standard Webhooks event, as an
// event bridge forwards it from the provider's webhook into the queue: the
// body byte for byte as signed, with the headers webhook-id,
// webhook-timestamp and webhook-signature (see PaymentConfig).
const ActionPaymentEvents = orderservice.PaymentEvents

// PaymentTopology is the payment events' default: stream PAYMENTS on
// payments.events (durable consumer orderconsumer), dead letters on
// payments.events.dead-letter (stream PAYMENTS_DEAD_LETTER); the queue
// payments.events and payments.events.dead-letter.
func PaymentTopology() Topology {
	return NamedTopology("PAYMENTS", "payments.events", "orderconsumer", "payments.events")
}

// Dead-letter reasons (queue.ReasonHeader) of a payment event whose
// signature does not hold, each with status 400 as the webhook answers
// it (one over payment.MaxBodyBytes is body-too-large, 413). Nothing is written for any of them: the message is refused before
// its key is claimed. A bridge's copy can never come to verify by
// delivering it again, so it is dead-lettered on its first delivery, where
// the webhook's 400 would have the provider retry its own copy.
const (
	// ReasonSignature: a webhook-* header is missing, or no signature
	// verifies with the configured secrets (payment.ErrSignature): a
	// forged event, or one signed with a secret this consumer does not
	// hold.
	ReasonSignature = "signature-not-verified"
	// ReasonStale: the signature holds, but webhook-timestamp is more
	// than Options.WebhookTolerance from the consumer's clock
	// (payment.ErrStale): a replay of an old delivery, or one that waited
	// in the queue for longer than the tolerance.
	ReasonStale = "timestamp-outside-tolerance"
	// ReasonMalformed: signed, but not an event of the schema
	// (payment.ErrMalformed; package idemstandard's doc).
	ReasonMalformed = "malformed-event"
)

// PaymentConfig is the queue configuration of the payment events: the
// same action as the service's payment webhook (Service.PaymentWebhook),
// so that one event is applied once whether the provider's webhook call
// or the bridge's message arrives first, or both at once.
//
//   - Validate verifies the Standard Webhooks signature over the raw body
//     with opts.WebhookSecrets (and, when opts.WebhookTolerance is set,
//     webhook-timestamp against opts.Now), before anything is claimed: a
//     forged, (stale) or malformed event is dead-lettered (ReasonSignature,
//     ReasonStale, ReasonMalformed; one over payment.MaxBodyBytes as
//     body-too-large) and nothing is written.
//   - Key is the verified event's ID, the webhook-id header; Scope and
//     the fingerprint are payment.ActionOf's (the provider and account,
//     the payload's digest), as the webhook's.
//   - Handler applies the event with payment.Apply in the record's
//     transaction, on the service's order store; an event of a type the
//     order's life does not follow (payment.Ignored) is acked without an
//     effect (its record says so, with 200 and an empty outcome).
//   - Middleware is the service's orderservice.PaymentEvents, which the
//     webhook uses too: one record per event, whichever path claims it.
//   - An event id seen again with another payload (the protocol's
//     key-reused) is the webhook's too: never applied, recorded as a
//     payload-mismatch anomaly (Service.RecordPayloadMismatch: once,
//     however many times and by whichever path it arrives), and its
//     message acked with the outcome {"anomaly":"payload-mismatch"},
//     since no redelivery can fix it (queue.Config.KeyReusedFunc). Only
//     the database's failure to record it delivers the message again.
//
// It fails only when opts.WebhookSecrets is empty or holds a
// secret that is not base64, or the service runs without idempotency.
func PaymentConfig(svc *orderservice.Service, opts Options) (queue.Config, error) {
	mw := svc.Middleware(orderservice.PaymentEvents)
	if mw == nil {
		return queue.Config{}, errors.New("orderqueue: payment events need the service's idempotency (orderservice.Options.Idempotency)")
	}
	v, err := idemstandard.New(idemstandard.Config{Secrets: opts.WebhookSecrets, Tolerance: opts.WebhookTolerance})
	if err != nil {
		return queue.Config{}, fmt.Errorf("orderqueue: Options.WebhookSecrets: %w", err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := paymentEvents{verifier: v, orders: svc.PaymentOrders(), now: now, checkClock: opts.WebhookTolerance > 0,
		recordMismatch: svc.RecordPayloadMismatch, logger: logger}
	return queue.Config{
		Middleware: mw, Handler: e.apply, KeyReusedFunc: e.keyReused,
		Validate: e.validate, Key: e.key, Scope: e.scope, FingerprintFunc: e.fingerprint,
		Workers:       opts.Workers,
		BatchSize:     opts.BatchSize,
		MaxDeliveries: opts.MaxDeliveries,
		RetryDelay:    opts.RetryDelay,
		Backoff:       opts.Backoff,
		BeforeSettle:  opts.BeforeSettle,
		Observe:       opts.Observe,
		Logger:        opts.Logger,
	}, nil
}

// paymentEvents reads a message's event for each of the queue's hooks.
// validate checks the signature and the timestamp against the clock;
// the hooks after it read the same event again, the signature checked
// again (an HMAC: cheap) but the timestamp against itself, so that a
// message validated a moment ago never turns stale halfway through its
// action.
type paymentEvents struct {
	verifier *idemstandard.Verifier
	orders   idempotency.Orders
	now      func() time.Time
	// checkClock: Options.WebhookTolerance was set.
	checkClock bool
	// recordMismatch records an event that reused an id with another
	// payload (Service.RecordPayloadMismatch).
	recordMismatch func(context.Context, payment.Event) error
	logger         *slog.Logger
}

func (e paymentEvents) validate(m *queue.Message) error {
	if !e.checkClock {
		_, err := e.event(m)
		return err
	}
	_, err := e.verifier.Verify(http.Header(m.Header), m.Body, e.now())
	return eventProblem(err)
}

// event is the message's verified event, at its own signing time.
func (e paymentEvents) event(m *queue.Message) (payment.Event, error) {
	ts, _ := m.HeaderValue(idemstandard.TimestampHeader)
	unix, err := strconv.ParseInt(strings.TrimSpace(ts), 10, 64)
	if err != nil {
		return payment.Event{}, eventProblem(fmt.Errorf("%w: %s: %v", payment.ErrSignature, idemstandard.TimestampHeader, err))
	}
	ev, err := e.verifier.Verify(http.Header(m.Header), m.Body, time.Unix(unix, 0))
	if err != nil {
		return payment.Event{}, eventProblem(err)
	}
	return ev, nil
}

func (e paymentEvents) key(m *queue.Message) (string, error) {
	ev, err := e.event(m)
	return ev.ID, err
}

func (e paymentEvents) scope(m *queue.Message) (string, error) {
	ev, err := e.event(m)
	return payment.ActionOf(ev).Scope, err
}

func (e paymentEvents) fingerprint(m *queue.Message) (string, error) {
	ev, err := e.event(m)
	return payment.ActionOf(ev).Fingerprint, err
}

// ignoredOutcome is the record of an event the order's life does not
// follow: no effect.
var ignoredOutcome, _ = json.Marshal(idempotency.PaymentOutcome{})

func (e paymentEvents) apply(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
	ev, err := e.event(m)
	if err != nil {
		// Validate let it through a moment ago: never expected.
		return idempotency.Result{Status: http.StatusBadRequest, Body: []byte(err.Error())}
	}
	if ev.Kind == payment.Ignored {
		return idempotency.Result{Status: http.StatusOK,
			Header: map[string][]string{"Content-Type": {"application/json"}}, Body: ignoredOutcome}
	}
	return payment.Apply(ctx, tx, e.orders, ev)
}

// mismatchOutcome is the answer to an event that reused an id with
// another payload, as the webhook's Observation tells it: no effect, the
// anomaly.
var mismatchOutcome, _ = json.Marshal(idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyPayloadMismatch})

// keyReused takes a message whose event id the protocol refused as reused
// with another payload: recorded as an anomaly, never applied, and acked,
// as the webhook acknowledges it; an error of the database's delivers the
// message again.
func (e paymentEvents) keyReused(ctx context.Context, m *queue.Message, refused idempotency.Answer) (idempotency.Answer, error) {
	ev, err := e.event(m)
	if err != nil {
		// Validate let it through a moment ago: never expected. The
		// refusal stands: dead-lettered.
		return refused, nil
	}
	if err := e.recordMismatch(ctx, ev); err != nil {
		return idempotency.Answer{}, err
	}
	e.logger.Warn("orderqueue: an event id arrived again with another payload; recorded as an anomaly, not applied",
		"provider", ev.Provider, "event", ev.ID, "source", m.Source)
	return idempotency.Answer{Status: http.StatusOK,
		Header: map[string][]string{"Content-Type": {"application/json"}}, Body: mismatchOutcome}, nil
}

// eventProblem is a verifier's error as the problem a message is
// dead-lettered with; nil stays nil.
func eventProblem(err error) error {
	status, kind, title := http.StatusBadRequest, "", ""
	switch {
	case err == nil:
		return nil
	case errors.Is(err, payment.ErrTooLarge):
		status, kind, title = http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge, "Event too large"
	case errors.Is(err, payment.ErrStale):
		kind, title = ReasonStale, "Timestamp outside the tolerance"
	case errors.Is(err, payment.ErrMalformed):
		kind, title = ReasonMalformed, "Malformed event"
	default:
		kind, title = ReasonSignature, "Signature not verified"
	}
	return idempotency.NewProblem(status, kind, title, err.Error())
}
