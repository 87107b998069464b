package frontendtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/payment"
)

// The payment events' part of the suite: a front-end that carries payment
// providers' signed events (a provider's webhook, a queue an event bridge
// feeds) serves the service's PaymentEvents action, whose key is the
// provider's event id. A provider delivers at least once, in no order, and
// retries every answer but its success; what it must see is the same
// whatever the transport: one application per event id however many
// deliveries arrive, at once or later; an id reused with another payload
// never applied, recorded as an anomaly and acknowledged (no retry can fix
// it); a fault of the infrastructure answered so that it delivers again,
// with nothing written; and a callback that does not verify refused before
// anything is written.

// Callback is one delivery of a provider event, in the suite's terms; the
// front-end's client writes it as its provider does (signed, encrypted,
// forwarded).
type Callback struct {
	// ID is the provider's event id: the key.
	ID string
	// Kind is payment.Succeeded or payment.Refunded.
	Kind payment.Kind
	// OrderNo is the order paid; PaymentID the provider's payment;
	// RefundID a refund's id.
	OrderNo, PaymentID, RefundID string
	// Amount is in minor units; Currency the ISO 4217 code.
	Amount   int64
	Currency string
	// Flaw makes the delivery one the provider did not send as it is.
	Flaw Flaw
}

// Flaw is what is wrong with a delivery.
type Flaw string

const (
	// Genuine: the provider's own delivery.
	Genuine Flaw = ""
	// Forged: signed with a key or secret the front-end does not hold.
	Forged Flaw = "forged"
	// Tampered: the body claims more than the body that was signed (the
	// signature of a 1-cent event on a body of the whole amount).
	Tampered Flaw = "tampered"
	// Unsigned: no signature at all.
	Unsigned Flaw = "unsigned"
	// Stale: correctly signed, with a timestamp an hour old.
	Stale Flaw = "stale"
	// Malformed: correctly signed, but no event of the schema (it names
	// no order).
	Malformed Flaw = "malformed"
	// Oversize: correctly signed, padded past payment.MaxBodyBytes.
	Oversize Flaw = "oversize"
)

// ErrUnsupported is a PaymentFrontend's answer to a flaw its provider
// cannot carry (a stale delivery of a provider that signs no time): the
// spec skips it.
var ErrUnsupported = errors.New("frontendtest: the provider has no such delivery")

// PaymentFrontend is a front-end of payment events, as the provider sees
// it.
type PaymentFrontend interface {
	// Deliver sends c through the transport, as the provider does, once,
	// and returns the answer in the contract's terms: a 2xx Status is the
	// provider's success (it stops delivering); RetryAfter marks an answer
	// that says when to deliver again (503 with Retry-After, a negative
	// acknowledgement with a delay); any other status is a refusal.
	Deliver(ctx context.Context, c Callback) Answer
}

// PaymentBuild serves env's service's payment events (Service.PaymentWebhook,
// or a consumer on its PaymentEvents Middleware) over the front-end's
// transport, for as long as t runs, and returns its provider's client.
type PaymentBuild func(t *testing.T, env *Env) PaymentFrontend

// ExercisePayments runs the payment events' part of the suite on db
// against the front-end build makes, in modes (both when none are given).
func ExercisePayments(t *testing.T, db Database, build PaymentBuild, modes ...idempotency.Mode) {
	if len(modes) == 0 {
		modes = []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase}
	}
	names := map[idempotency.Mode]string{idempotency.ModeClaimFirst: "claim-first", idempotency.ModeSinglePhase: "single-phase"}
	for _, m := range modes {
		t.Run(db.Name()+"/"+names[m]+"/payments", func(t *testing.T) {
			t.Parallel()
			s := &paymentSuite{suite: suite{db: db, mode: m, hooks: &hooks{byKey: map[string]hook{}}}, build: build}
			s.env, s.store = s.newEnv(t, idempotency.Config{Mode: m}, nil)
			s.front = build(t, s.env)
			s.run(t)
		})
	}
}

// paymentSuite is one engine and mode of the payment specs: one database
// and service that the specs share, each with orders and event ids of its
// own.
type paymentSuite struct {
	suite
	build PaymentBuild
	front PaymentFrontend
	n     atomic.Int64
}

func (s *paymentSuite) run(t *testing.T) {
	for _, spec := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"AStormOfOneEvent_AppliesItOnce_EveryDeliveryAcknowledged", s.storm},
		{"ARedelivery_IsAcknowledgedAndNeverAppliedAgain", s.redelivery},
		{"TheIDWithAnotherPayload_IsAnAnomalyAcknowledged_NeverApplied", s.payloadMismatch},
		{"AnEventThatCannotApply_IsRecordedOnceAndAcknowledged", s.cannotApply},
		{"AnUnreachableStore_IsAnsweredRetryably_NothingWritten", s.unreachable},
		{"ARunTheDatabaseRolledBack_IsAppliedOnce", s.rolledBack},
		{"ACallbackNotTheProviders_IsRefusedAndWritesNothing", s.refused},
	} {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			spec.fn(t)
		})
	}
}

// order creates an order of 1000 cents CNY, CREATED, and returns a
// success event that pays it (its id, payment id and order the spec's
// own).
func (s *paymentSuite) order(t *testing.T, env *Env) Callback {
	t.Helper()
	n := s.n.Add(1)
	user := s.user()
	no := fmt.Sprintf("FT%d-%d", user, n)
	ctx := context.Background()
	tx, err := env.DB.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, env.Service.PaymentOrders().Create(ctx, tx, &idempotency.Order{
		OrderNo: no, Scope: strconv.FormatInt(user, 10), UserID: user, SKUID: orderservice.FirstSKU, Quantity: 1,
		UnitPriceCents: 1000, TotalCents: 1000, Currency: "CNY", Status: idempotency.OrderCreated,
	}))
	require.NoError(t, tx.Commit())
	return Callback{ID: "evt_" + no, Kind: payment.Succeeded, OrderNo: no, PaymentID: "pay_" + no, Amount: 1000, Currency: "CNY"}
}

// refundOf is the full refund of success's payment.
func refundOf(success Callback) Callback {
	r := success
	r.ID, r.Kind, r.RefundID = "evt_refund_"+success.OrderNo, payment.Refunded, "rf_"+success.OrderNo
	return r
}

// acked reports an answer the provider reads as its success.
func (a Answer) acked() bool { return a.Err == nil && a.Status >= 200 && a.Status < 300 }

// asProvider delivers c as the provider does: again while the answer is
// not its success, as long as the answer says to deliver again (a
// refusal of bad input stops the spec's provider: its answer is final).
func asProvider(front PaymentFrontend, c Callback) Answer {
	a, _ := resendPayment(front, c, Answer.retryable)
	return a
}

func resendPayment(front PaymentFrontend, c Callback, again func(Answer) bool) (Answer, int) {
	return resend(paymentCreator{front, c}, Request{}, again)
}

// paymentCreator lets resend deliver a callback.
type paymentCreator struct {
	front PaymentFrontend
	c     Callback
}

func (p paymentCreator) Create(ctx context.Context, _ Request) Answer {
	return p.front.Deliver(ctx, p.c)
}

// paymentFacts are what the order store holds of an order.
type paymentFacts struct {
	Status        string
	Payments      int   // order_payment rows
	EventsApplied int   // their events_applied
	RefundedCents int64 // their refunded_cents
	Events        int   // payment_event rows
}

// q is query in env's dialect: ? placeholders become $n on PostgreSQL.
func q(env *Env, query string) string {
	if env.Dialect != "postgres" {
		return query
	}
	for i := 1; strings.Contains(query, "?"); i++ {
		query = strings.Replace(query, "?", "$"+strconv.Itoa(i), 1)
	}
	return query
}

func (s *paymentSuite) facts(t *testing.T, env *Env, orderNo string) paymentFacts {
	t.Helper()
	var f paymentFacts
	require.NoError(t, env.DB.QueryRow(q(env, `SELECT status FROM purchase_order WHERE order_no = ?`), orderNo).Scan(&f.Status))
	require.NoError(t, env.DB.QueryRow(q(env, `SELECT COUNT(*), COALESCE(SUM(events_applied), 0), COALESCE(SUM(refunded_cents), 0) FROM order_payment WHERE order_no = ?`),
		orderNo).Scan(&f.Payments, &f.EventsApplied, &f.RefundedCents))
	require.NoError(t, env.DB.QueryRow(q(env, `SELECT COUNT(*) FROM payment_event WHERE order_no = ?`), orderNo).Scan(&f.Events))
	return f
}

// eventRecords counts the idempotency records of event id.
func (s *paymentSuite) eventRecords(t *testing.T, env *Env, id string) int {
	t.Helper()
	var n int
	require.NoError(t, env.DB.QueryRow(q(env, `SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key = ?`), id).Scan(&n))
	return n
}

// anomalies counts the anomalies of event id for reason.
func (s *paymentSuite) anomalies(t *testing.T, env *Env, id string, reason idempotency.AnomalyReason) int {
	t.Helper()
	var n int
	require.NoError(t, env.DB.QueryRow(q(env, `SELECT COUNT(*) FROM payment_anomaly WHERE event_id = ? AND reason = ?`), id, string(reason)).Scan(&n))
	return n
}

var paidOnce = paymentFacts{Status: "PAID", Payments: 1, EventsApplied: 1, Events: 1}

func (s *paymentSuite) storm(t *testing.T) {
	c := s.order(t, s.env)
	const n = 16
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = asProvider(s.front, c)
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		require.True(t, a.acked(), "delivery %d, delivered again as the provider does: %s", i, a)
	}
	require.Equal(t, paidOnce, s.facts(t, s.env, c.OrderNo), "one application for %d concurrent deliveries", n)
	require.Equal(t, 1, s.eventRecords(t, s.env, c.ID))
}

func (s *paymentSuite) redelivery(t *testing.T) {
	c := s.order(t, s.env)
	for i := range 2 {
		a := asProvider(s.front, c)
		require.True(t, a.acked(), "delivery %d of the success: %s", i+1, a)
		require.Equal(t, paidOnce, s.facts(t, s.env, c.OrderNo), "after delivery %d", i+1)
	}
	r := refundOf(c)
	for i := range 2 {
		a := asProvider(s.front, r)
		require.True(t, a.acked(), "delivery %d of the refund: %s", i+1, a)
		require.Equal(t, paymentFacts{Status: "REFUNDED", Payments: 1, EventsApplied: 2, RefundedCents: 1000, Events: 2},
			s.facts(t, s.env, c.OrderNo), "after delivery %d of the refund", i+1)
	}
	require.Equal(t, 2, s.eventRecords(t, s.env, c.ID)+s.eventRecords(t, s.env, r.ID), "one record per event")
}

func (s *paymentSuite) payloadMismatch(t *testing.T) {
	first := s.order(t, s.env)
	other := s.order(t, s.env)
	require.True(t, asProvider(s.front, first).acked())

	// The first event's id, claiming the other order was paid.
	reused := other
	reused.ID = first.ID
	for i := range 2 {
		a := asProvider(s.front, reused)
		require.True(t, a.acked(), "delivery %d: acknowledged, since no retry can fix it: %s", i+1, a)
		require.Equal(t, 1, s.anomalies(t, s.env, reused.ID, idempotency.AnomalyPayloadMismatch),
			"delivery %d: recorded as an anomaly, once", i+1)
	}
	require.Equal(t, paymentFacts{Status: "CREATED"}, s.facts(t, s.env, other.OrderNo), "never applied")
	require.Equal(t, paidOnce, s.facts(t, s.env, first.OrderNo), "the first payload's effect, once")
	require.Equal(t, 1, s.eventRecords(t, s.env, first.ID))
}

func (s *paymentSuite) cannotApply(t *testing.T) {
	c := s.order(t, s.env)
	c.OrderNo = "NO-SUCH-" + c.OrderNo
	for i := range 2 {
		a := asProvider(s.front, c)
		require.True(t, a.acked(), "delivery %d: acknowledged, since no retry can fix it: %s", i+1, a)
	}
	require.Equal(t, 1, s.anomalies(t, s.env, c.ID, idempotency.AnomalyUnknownOrder), "recorded once")
	require.Equal(t, 1, s.eventRecords(t, s.env, c.ID))
}

func (s *paymentSuite) unreachable(t *testing.T) {
	env, _ := s.newEnv(t, idempotency.Config{Mode: s.mode}, s.db.Unreachable(t))
	front := s.build(t, env)
	c := s.order(t, env)
	a := front.Deliver(context.Background(), c)
	require.NoError(t, a.Err)
	require.Equal(t, http.StatusServiceUnavailable, a.Status, "a fault of the infrastructure: %s", a)
	require.True(t, a.RetryAfter, "it says when to deliver again: %s", a)
	require.Equal(t, paymentFacts{Status: "CREATED"}, s.facts(t, env, c.OrderNo), "nothing written")
	require.Zero(t, s.eventRecords(t, env, c.ID))
}

// rolledBack: the database rolls back the run that would have finished
// the event's record (a deadlock at the record). Claim-first answers 503
// with a retry hint, and the provider's redelivery applies it;
// single-phase applies it again within the delivery (or, when a
// concurrent spec's payment deadlocks with that run for real, as InnoDB's
// gap locks make them do, answers the same 503). Once either way.
func (s *paymentSuite) rolledBack(t *testing.T) {
	c := s.order(t, s.env)
	s.store.failNext(c.ID, 1)
	a := s.front.Deliver(context.Background(), c)
	if s.mode == idempotency.ModeClaimFirst {
		require.Equal(t, http.StatusServiceUnavailable, a.Status, "%s", a)
	}
	if !a.acked() {
		require.True(t, a.retryable(), "%s", a)
		a = asProvider(s.front, c)
	}
	require.True(t, a.acked(), "%s", a)
	require.Equal(t, paidOnce, s.facts(t, s.env, c.OrderNo))
	require.True(t, asProvider(s.front, c).acked())
	require.Equal(t, paidOnce, s.facts(t, s.env, c.OrderNo))
	require.Equal(t, 1, s.eventRecords(t, s.env, c.ID))
}

// refused: a callback the provider did not send as it is is refused as
// bad input (400, or 413 for the oversized one; never a retry hint),
// before anything is written; the provider's own delivery of the same id
// is then applied, the key still new.
func (s *paymentSuite) refused(t *testing.T) {
	c := s.order(t, s.env)
	for _, flaw := range []Flaw{Forged, Tampered, Unsigned, Stale, Malformed, Oversize} {
		bad := c
		bad.Flaw = flaw
		if flaw != Oversize && flaw != Malformed {
			bad = refundOf(c) // what a forger claims: the money back
			bad.ID, bad.Flaw = c.ID, flaw
		}
		a := s.front.Deliver(context.Background(), bad)
		if errors.Is(a.Err, ErrUnsupported) {
			continue
		}
		require.NoError(t, a.Err, "%s", flaw)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusRequestEntityTooLarge}, a.Status,
			"a %s callback is bad input: %s", flaw, a)
		require.False(t, a.RetryAfter, "a %s callback is refused for good: %s", flaw, a)
		require.Zero(t, s.eventRecords(t, s.env, c.ID), "a %s callback is refused before anything is written", flaw)
		require.Equal(t, paymentFacts{Status: "CREATED"}, s.facts(t, s.env, c.OrderNo), "a %s callback wrote nothing", flaw)
	}
	a := asProvider(s.front, c)
	require.True(t, a.acked(), "the provider's own delivery, the key still new: %s", a)
	require.Equal(t, paidOnce, s.facts(t, s.env, c.OrderNo))
}
