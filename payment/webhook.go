package payment

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/orderguard/idempotency"
)

// Config configures a Webhook: one provider's callbacks on one route.
type Config struct {
	// Verifier checks the provider's callbacks. Required.
	Verifier Verifier

	// Middleware runs the protocol: each event is an action under the key
	// Event.ID, in the scope ActionOf gives, with the fingerprint
	// Event.Digest. Share it with the provider's other paths (a queue an
	// event bridge feeds) so that one event is one action on every path.
	// On MySQL-family servers give it Config.TxOptions READ COMMITTED:
	// at REPEATABLE READ the events of different orders lock the index
	// gaps beside each other's rows and deadlock (transient, answered
	// 503 and redelivered, but most of a busy provider's events first
	// fail so). Required.
	Middleware *idempotency.Middleware

	// Orders is the order store's SQL in the database's dialect
	// (idempotency.MySQLOrders, PostgresOrders, SQLiteOrders). Required
	// (a zero Orders is refused).
	Orders idempotency.Orders

	// DB is the orders' database, where an event that reused an id with
	// another payload is recorded as an anomaly, outside the protocol
	// (which refuses it before anything runs). Required.
	DB *sql.DB

	// Now is the clock the verifier checks timestamps against. Defaults
	// to time.Now.
	Now func() time.Time

	// Observe, when set, receives every callback's fate. Defaults to
	// none.
	Observe func(Observation)

	// Logger receives a line for every refused callback and anomaly.
	// Defaults to discarding.
	Logger *slog.Logger
}

// Observation is what became of one callback.
type Observation struct {
	Provider string
	// Event is the verified event; zero when the callback was refused
	// before it verified.
	Event Event
	// Refused is why the callback was refused, matched with errors.Is
	// (ErrSignature, ErrStale, ErrMalformed, ErrTooLarge, or the
	// protocol's problem); nil when it was acknowledged.
	Refused error
	// Status is the HTTP status answered.
	Status int
	// Outcome is what the event did (the first delivery's, on a replay).
	Outcome idempotency.PaymentOutcome
	// Replayed: a delivery of an event handled before, answered from its
	// record without running anything.
	Replayed bool
}

// Webhook serves one provider's callbacks: each verified over its raw body
// before anything is parsed or written, applied to the order store exactly
// once per event id (the protocol's record commits with the effect), and
// answered in the provider's convention, so that the provider stops
// delivering exactly when the effect is committed.
type Webhook struct {
	cfg Config
}

// NewWebhook returns the webhook of cfg.
func NewWebhook(cfg Config) (*Webhook, error) {
	switch {
	case cfg.Verifier == nil:
		return nil, errors.New("payment: Config.Verifier is required")
	case cfg.Middleware == nil:
		return nil, errors.New("payment: Config.Middleware is required")
	case cfg.DB == nil:
		return nil, errors.New("payment: Config.DB is required")
	case cfg.Orders.InsertOrder == "":
		return nil, errors.New("payment: Config.Orders is required (idempotency.MySQLOrders, PostgresOrders or SQLiteOrders)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Webhook{cfg: cfg}, nil
}

// maxReadBytes bounds what is read of a body: more than any verifier's
// limit, so that the verifier's own ErrTooLarge decides.
const maxReadBytes = 1 << 20

// ServeHTTP is one callback: 1. the raw body, 2. the signature and the
// event (Verifier.Verify), 3. the event as an action of the protocol
// (ActionOf), applied in the record's transaction (Apply), 4. the answer
// in the provider's convention.
func (h *Webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v := h.cfg.Verifier
	obs := Observation{Provider: v.Provider()}
	// 1. The raw body, byte for byte: the signature covers it.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReadBytes+1))
	if err == nil && len(body) > maxReadBytes {
		err = fmt.Errorf("%w: over %d bytes", ErrTooLarge, maxReadBytes)
	}
	// 2. Verified before anything is parsed or written.
	var ev Event
	if err == nil {
		ev, err = v.Verify(r.Header, body, h.cfg.Now())
	}
	if err != nil {
		h.refuse(w, &obs, http.StatusBadRequest, err)
		return
	}
	obs.Event = ev
	if ev.Kind == Ignored {
		h.acknowledge(w, &obs)
		return
	}
	// 3. Exactly once per event id.
	ans := h.cfg.Middleware.Do(r.Context(), ActionOf(ev), func(ctx context.Context) idempotency.Result {
		tx, _ := idempotency.TxFromContext(ctx)
		res, err := apply(ctx, tx, h.cfg.Orders, ev)
		if err != nil {
			h.cfg.Logger.Warn("payment: event not applied; the provider delivers it again",
				"provider", ev.Provider, "event", ev.ID, "err", err)
		}
		return res
	})
	// 4. The answer.
	h.answer(w, r.Context(), &obs, ans)
}

// answer sends the protocol's answer in the provider's convention.
func (h *Webhook) answer(w http.ResponseWriter, ctx context.Context, obs *Observation, ans idempotency.Answer) {
	p := ans.Problem
	switch {
	case p != nil && p.Kind() == idempotency.ProblemKeyReused:
		// The same event id with another payload: never applied, but
		// recorded, and acknowledged, since no retry can fix it.
		if err := RecordPayloadMismatch(ctx, h.cfg.DB, h.cfg.Orders, obs.Event); err != nil {
			h.refuse(w, obs, http.StatusServiceUnavailable, err)
			return
		}
		obs.Outcome = idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyPayloadMismatch}
		h.cfg.Logger.Warn("payment: an event id arrived again with another payload; not applied",
			"provider", obs.Provider, "event", obs.Event.ID)
		h.acknowledge(w, obs)
	case p != nil && p.RetryAfter > 0:
		w.Header().Set("Retry-After", strconv.Itoa(p.RetryAfter))
		h.refuse(w, obs, http.StatusServiceUnavailable, p)
	case p != nil:
		h.refuse(w, obs, p.Status, p)
	case ans.Status >= 200 && ans.Status < 300:
		_ = json.Unmarshal(ans.Body, &obs.Outcome)
		obs.Replayed = ans.Replayed
		if obs.Outcome.Anomaly != "" && !ans.Replayed {
			h.cfg.Logger.Warn("payment: event recorded as an anomaly", "provider", obs.Provider,
				"event", obs.Event.ID, "reason", obs.Outcome.Anomaly, "order", obs.Outcome.OrderNo)
		}
		h.acknowledge(w, obs)
	default:
		// The store failed for a moment: the provider delivers again.
		if ra := ans.Header["Retry-After"]; len(ra) > 0 {
			w.Header().Set("Retry-After", ra[0])
		}
		h.refuse(w, obs, http.StatusServiceUnavailable, fmt.Errorf("payment: the event was not applied (%d): %s", ans.Status, ans.Body))
	}
}

// RecordPayloadMismatch records ev, a verified event whose id the protocol
// refused as reused with another payload (idempotency.ProblemKeyReused),
// as an anomaly of reason idempotency.AnomalyPayloadMismatch, in a
// transaction of its own on db, and never applies it: the first delivery's
// payload is the event's, whatever became of it. A retry cannot fix it,
// so every path an event arrives by answers it as handled once this
// returns nil (the webhook acknowledges it, a queue consumer acks its
// message); recording the same payload again is a no-op, so it is
// recorded once however many times, and by however many paths, it
// arrives. An error is the database's: the delivery is refused for the
// provider (or the broker) to deliver it again.
func RecordPayloadMismatch(ctx context.Context, db *sql.DB, orders idempotency.Orders, ev Event) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := orders.RecordPayloadMismatch(ctx, tx, storeEvent(ev)); err != nil {
		return err
	}
	return tx.Commit()
}

func (h *Webhook) acknowledge(w http.ResponseWriter, obs *Observation) {
	h.cfg.Verifier.Acknowledge(w)
	obs.Status = statusOf(w, http.StatusOK)
	if h.cfg.Observe != nil {
		h.cfg.Observe(*obs)
	}
}

func (h *Webhook) refuse(w http.ResponseWriter, obs *Observation, status int, err error) {
	obs.Refused, obs.Status = err, status
	h.cfg.Logger.Warn("payment: callback refused", "provider", obs.Provider, "event", obs.Event.ID, "status", status, "err", err)
	h.cfg.Verifier.Refuse(w, status, refusal(err))
	if h.cfg.Observe != nil {
		h.cfg.Observe(*obs)
	}
}

// refusal is what a refused callback's answer says: the kind of failure,
// never a database's text.
func refusal(err error) string {
	var p *idempotency.Problem
	switch {
	case errors.Is(err, ErrSignature):
		return "signature not verified"
	case errors.Is(err, ErrStale):
		return "timestamp outside the tolerance"
	case errors.Is(err, ErrMalformed):
		return "malformed callback"
	case errors.Is(err, ErrTooLarge):
		return "body too large"
	case errors.As(err, &p):
		return p.Title
	}
	return "not handled; deliver it again"
}

// statusOf is the status a ResponseWriter wrote, where it tells.
func statusOf(w http.ResponseWriter, def int) int {
	if s, ok := w.(interface{ Status() int }); ok {
		return s.Status()
	}
	return def
}

// ActionOf is an event as an action of the protocol: the key is the
// provider's event id, owned by the provider's account (a scope per
// provider, so that two providers' ids never meet), the fingerprint the
// event's payload digest. Every path an event arrives by (the webhook, a
// queue an event bridge feeds) uses it, so one event is one action.
func ActionOf(ev Event) idempotency.Action {
	return idempotency.Action{Scope: ev.Provider + "/" + ev.Scope, Key: ev.ID, Fingerprint: ev.Digest}
}

// Apply applies a verified event to the order store in tx, the record's
// transaction, and answers it as the record keeps it: 200 with the
// outcome as JSON (an anomaly too: it is recorded, and acknowledged, since
// a redelivery cannot fix it), or 503 with Retry-After when the store
// failed (the database for a moment, a concurrent change), so that nothing
// is recorded and the provider's redelivery applies it.
func Apply(ctx context.Context, tx *sql.Tx, orders idempotency.Orders, ev Event) idempotency.Result {
	res, _ := apply(ctx, tx, orders, ev)
	return res
}

// apply is Apply, with the store's error behind a 503.
func apply(ctx context.Context, tx *sql.Tx, orders idempotency.Orders, ev Event) (idempotency.Result, error) {
	out, err := orders.ApplyPayment(ctx, tx, storeEvent(ev))
	switch {
	case errors.Is(err, idempotency.ErrInvalidPaymentEvent):
		// Verified, but not an event the store can hold (an amount of
		// zero, an id too long): no redelivery changes that, so it is
		// recorded here, in the event's record, and acknowledged.
		out, err = idempotency.PaymentOutcome{Anomaly: AnomalyInvalidEvent}, nil
	case errors.Is(err, idempotency.ErrInvalidTransition):
		// The order is in a state its facts cannot move it from (an
		// operator moved it by hand): no redelivery changes that either.
		out, err = idempotency.PaymentOutcome{OrderNo: ev.OrderNo, Anomaly: AnomalyStateMismatch}, nil
	}
	if err != nil {
		return idempotency.Result{Status: http.StatusServiceUnavailable,
			Header: map[string][]string{"Retry-After": {"1"}, "Content-Type": {"text/plain"}},
			Body:   []byte("the event was not applied; deliver it again")}, err
	}
	body, _ := json.Marshal(out)
	return idempotency.Result{Status: http.StatusOK, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}, nil
}

// AnomalyInvalidEvent is the outcome of a verified event the order store
// refuses to hold (idempotency.ErrInvalidPaymentEvent: an amount of zero,
// an id over 255 bytes): recorded in the event's idempotency record, not
// in payment_anomaly, and acknowledged.
const AnomalyInvalidEvent idempotency.AnomalyReason = "invalid-event"

// AnomalyStateMismatch is the outcome of a verified event whose order is in
// a state its payment facts cannot move it from (idempotency's
// ErrInvalidTransition: moved by hand, outside the payment state machine):
// recorded in the event's idempotency record and acknowledged.
const AnomalyStateMismatch idempotency.AnomalyReason = "state-mismatch"

// storeEvent is an event in the order store's terms.
func storeEvent(ev Event) idempotency.PaymentEvent {
	kind := idempotency.PaymentSucceeded
	switch {
	case ev.Kind == Refunded && ev.RefundID == "":
		kind = idempotency.PaymentRefundedTotal // the payment's whole refunded amount so far
	case ev.Kind == Refunded:
		kind = idempotency.PaymentRefunded
	}
	return idempotency.PaymentEvent{
		Provider: ev.Provider, EventID: ev.ID, PaymentID: ev.PaymentID, OrderNo: ev.OrderNo,
		Kind: kind, RefundID: ev.RefundID, Amount: ev.Amount, Currency: ev.Currency, Digest: ev.Digest,
	}
}
