package orderqueue_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/payment"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	"github.com/orderguard/idempotency/queue"
)

// paymentBundle is one run of the payment events: a fresh database and
// order service, its payment webhook served over HTTP, and its consumer of
// payments on a topology of the run's own, both with one secret.
type paymentBundle struct {
	*faultRun
	secret  string
	webhook string // the webhook's URL
	service string // the order API's URL
	pub     orderqueue.Publisher

	mu       sync.Mutex
	observed map[string][]payment.Observation // the webhook's, by event id
}

func setupPayments(t *testing.T, broker string, db string) *paymentBundle {
	t.Helper()
	engine := databases[0]
	for _, d := range databases {
		if d.Name() == db {
			engine = d
		}
	}
	modes := map[string]idempotency.Mode{"mysql": idempotency.ModeClaimFirst, "postgres": idempotency.ModeSinglePhase}
	b := &paymentBundle{faultRun: newFaultRun(t, broker, engine, modes[db]), secret: newSecret(),
		observed: map[string][]payment.Observation{}}
	opts := b.options()
	opts.Action, opts.WebhookSecrets = orderqueue.ActionPaymentEvents, []string{b.secret}
	opts.WebhookTolerance = 5 * time.Minute // the stale specs check the clock
	consumer(t, b.svc, opts)
	b.pub = publisher(t, b.broker, b.topo)

	v, err := idemstandard.New(idemstandard.Config{Secrets: []string{b.secret}})
	require.NoError(t, err)
	wh, err := b.svc.PaymentWebhook(v, func(o payment.Observation) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.observed[o.Event.ID] = append(b.observed[o.Event.ID], o)
	})
	require.NoError(t, err)
	hook := httptest.NewServer(wh)
	t.Cleanup(hook.Close)
	api := httptest.NewServer(b.svc)
	t.Cleanup(api.Close)
	b.webhook, b.service = hook.URL, api.URL
	return b
}

func newSecret() string {
	var k [32]byte
	_, _ = rand.Read(k[:])
	return "whsec_" + base64.StdEncoding.EncodeToString(k[:])
}

// order creates an order of user 7 over the order API and returns its
// number and total.
func (b *paymentBundle) order(t *testing.T) (orderNo string, total int64) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.service+"/orders", bytes.NewReader(createBody(7, orderservice.FirstSKU, 2, nil)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "7")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("order-%d", requests.Add(1)))
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var o orderservice.OrderResponse
	require.NoError(t, json.NewDecoder(res.Body).Decode(&o))
	return o.OrderNo, o.TotalCents
}

// event is a payment event of the package idemstandard's schema.
type event struct {
	ID, Type, OrderNo, PaymentID, RefundID string
	Amount                                 int64
}

func (e event) body() []byte {
	data := map[string]any{"order_no": e.OrderNo, "payment_id": e.PaymentID, "amount": e.Amount, "currency": "CNY"}
	if e.RefundID != "" {
		data["refund_id"] = e.RefundID
	}
	raw, _ := json.Marshal(map[string]any{"type": e.Type, "timestamp": "2025-03-14T09:26:53Z", "data": data})
	return raw
}

// signed is e's body and headers, signed with secret at ts.
func signed(t *testing.T, secret string, e event, ts time.Time) ([]byte, http.Header) {
	t.Helper()
	body := e.body()
	h, err := idemstandard.Sign(secret, e.ID, ts, body)
	require.NoError(t, err)
	return body, h
}

// byWebhook delivers e to the webhook as its provider does: again while
// it is refused (the queue's copy holds the key: 503), until a 2xx.
func (b *paymentBundle) byWebhook(t *testing.T, e event) (statuses []int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, h := signed(t, b.secret, e, time.Now())
		req, err := http.NewRequest(http.MethodPost, b.webhook, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header = h
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		statuses = append(statuses, res.StatusCode)
		if res.StatusCode/100 == 2 || time.Now().After(deadline) {
			return statuses
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// byQueue publishes e as a bridge forwards it: the signed body with the
// webhook-* headers, the event id as the message id. It returns the
// request's number, whose settlements the run observes.
func (b *paymentBundle) byQueue(t *testing.T, secret string, e event, ts time.Time) string {
	t.Helper()
	return b.publish(t, secret, e, ts, e.ID)
}

// publish publishes e as byQueue does, under message id msgID: a copy the
// bridge forwarded again, past JetStream's deduplication of the id (the
// key is webhook-id, whatever the message id). Its settlements are
// msgID's.
func (b *paymentBundle) publish(t *testing.T, secret string, e event, ts time.Time, msgID string) string {
	t.Helper()
	body, h := signed(t, secret, e, ts)
	req := strconv.FormatInt(requests.Add(1), 10)
	m := orderqueue.Message{ID: msgID, Body: body, Header: map[string]string{requestHeader: req}}
	for k := range h {
		m.Header[k] = h.Get(k)
	}
	_, err := b.pub.Publish(context.Background(), m)
	require.NoError(t, err)
	return req
}

// settled waits for the final settlement of the message of event id.
func (b *paymentBundle) settled(t *testing.T, id string) queue.Settlement {
	t.Helper()
	var last queue.Settlement
	require.Eventually(t, func() bool {
		all := b.faultRun.settled.of(id)
		if len(all) == 0 {
			return false
		}
		last = all[len(all)-1]
		return last.Decision != queue.Nak && last.Err == nil
	}, 30*time.Second, 5*time.Millisecond, "the message of %s was settled", id)
	return last
}

// query runs a statement of one row written with ? in the run's dialect.
func (b *paymentBundle) query(t *testing.T, q string, args []any, dest ...any) {
	t.Helper()
	if b.dialect == "postgres" {
		for i := 1; strings.Contains(q, "?"); i++ {
			q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
		}
	}
	require.NoError(t, b.db.QueryRow(q, args...).Scan(dest...))
}

// facts are what the order store holds of an order and its payment.
type facts struct {
	Status         string
	EventsApplied  int
	RefundedCents  int64
	PaymentEvents  int // payment_event rows of the order
	Records        int // idempotency records of the payment events
	PaymentRecords int
}

func (b *paymentBundle) facts(t *testing.T, orderNo string) facts {
	t.Helper()
	var f facts
	b.query(t, `SELECT status FROM purchase_order WHERE order_no = ?`, []any{orderNo}, &f.Status)
	b.query(t, `SELECT COUNT(*), COALESCE(SUM(events_applied), 0), COALESCE(SUM(refunded_cents), 0) FROM order_payment WHERE order_no = ?`,
		[]any{orderNo}, &f.PaymentRecords, &f.EventsApplied, &f.RefundedCents)
	b.query(t, `SELECT COUNT(*) FROM payment_event WHERE order_no = ?`, []any{orderNo}, &f.PaymentEvents)
	return f
}

// records counts the idempotency records of the event ids.
func (b *paymentBundle) records(t *testing.T, ids ...string) int {
	t.Helper()
	total := 0
	for _, id := range ids {
		var n int
		b.query(t, `SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key = ?`, []any{id}, &n)
		total += n
	}
	return total
}

// The arrivals of one event by both paths.
var arrivals = []struct {
	name    string
	deliver func(t *testing.T, b *paymentBundle, e event) (webhook []int, message queue.Settlement)
}{
	{"WebhookFirst", func(t *testing.T, b *paymentBundle, e event) ([]int, queue.Settlement) {
		statuses := b.byWebhook(t, e)
		b.byQueue(t, b.secret, e, time.Now())
		return statuses, b.settled(t, e.ID)
	}},
	{"QueueFirst", func(t *testing.T, b *paymentBundle, e event) ([]int, queue.Settlement) {
		b.byQueue(t, b.secret, e, time.Now())
		s := b.settled(t, e.ID)
		return b.byWebhook(t, e), s
	}},
	{"AtOnce", func(t *testing.T, b *paymentBundle, e event) ([]int, queue.Settlement) {
		start := make(chan struct{})
		var statuses []int
		var wg sync.WaitGroup
		wg.Go(func() { <-start; statuses = b.byWebhook(t, e) })
		wg.Go(func() { <-start; b.byQueue(t, b.secret, e, time.Now()) })
		close(start)
		wg.Wait()
		return statuses, b.settled(t, e.ID)
	}},
}

// One provider event, delivered by its webhook and by a bridge's message,
// in either order or at once, is one action: its effect applied once
// (events_applied 1: the order PAID once; then the refund once), one
// idempotency record, and both paths acknowledged, the second by the
// first's record. NATS and RabbitMQ; claim-first on MariaDB, single-phase
// on PostgreSQL.
func TestPaymentEvents_ByWebhookAndByQueue_AreOneAction(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				b := setupPayments(t, broker(t), db.Name())
				var n atomic.Int64
				for _, a := range arrivals {
					t.Run(a.name, func(t *testing.T) {
						orderNo, total := b.order(t)
						id := fmt.Sprintf("%s-%d", a.name, n.Add(1))
						paid := event{ID: "evt_paid_" + id, Type: "payment.succeeded", OrderNo: orderNo, PaymentID: "pay_" + id, Amount: total}
						refund := event{ID: "evt_refund_" + id, Type: "payment.refunded", OrderNo: orderNo, PaymentID: "pay_" + id,
							RefundID: "rf_" + id, Amount: total}

						statuses, s := a.deliver(t, b, paid)
						b.requireOneAction(t, paid, statuses, s)
						require.Equal(t, facts{Status: "PAID", EventsApplied: 1, PaymentEvents: 1, PaymentRecords: 1}, b.facts(t, orderNo))

						statuses, s = a.deliver(t, b, refund)
						b.requireOneAction(t, refund, statuses, s)
						require.Equal(t, facts{Status: "REFUNDED", EventsApplied: 2, RefundedCents: total, PaymentEvents: 2, PaymentRecords: 1},
							b.facts(t, orderNo))
						require.Equal(t, 2, b.records(t, paid.ID, refund.ID))
					})
				}
			})
		}
	}
}

// requireOneAction checks both paths' answers to e: the webhook's 2xx
// (after 503s while the message held the key) and the message's ack, one
// of the two running the action and the other replaying its record.
func (b *paymentBundle) requireOneAction(t *testing.T, e event, statuses []int, s queue.Settlement) {
	t.Helper()
	require.Equal(t, http.StatusNoContent, statuses[len(statuses)-1], "the webhook acknowledged: %v", statuses)
	for _, st := range statuses[:len(statuses)-1] {
		require.Equal(t, http.StatusServiceUnavailable, st, "only refused while the key was in progress: %v", statuses)
	}
	require.Equal(t, queue.Ack, s.Decision, "%s", answerOf(s))
	require.Equal(t, http.StatusOK, s.Answer.Status, "%s", answerOf(s))
	var out idempotency.PaymentOutcome
	require.NoError(t, json.Unmarshal(s.Answer.Body, &out))
	require.True(t, out.Applied, "%s", s.Answer.Body)
	require.Equal(t, e.OrderNo, out.OrderNo)

	b.mu.Lock()
	observed := b.observed[e.ID]
	b.mu.Unlock()
	last := observed[len(observed)-1]
	require.NoError(t, last.Refused)
	ran := "the webhook"
	if last.Replayed {
		ran = "the message"
	}
	t.Logf("%s: %s ran it; webhook answers %v, message settlements %d", e.ID, ran, statuses, len(b.faultRun.settled.of(e.ID)))
	require.NotEqual(t, last.Replayed, s.Answer.Replayed,
		"one path ran the action and the other replayed it (webhook replayed %v, message replayed %v)", last.Replayed, s.Answer.Replayed)
}

// An event id that arrives again by the queue with another payload is
// what it is on the webhook: never applied, recorded as a
// payload-mismatch anomaly once (however many copies arrive, by either
// path), and its message acked, never dead-lettered, since no redelivery
// can fix it. NATS and RabbitMQ; claim-first on MariaDB, single-phase on
// PostgreSQL.
func TestPaymentEvents_SameIDAnotherPayload_RecordedOnceAckedNeverApplied(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				b := setupPayments(t, broker(t), db.Name())
				orderNo, total := b.order(t)
				other, _ := b.order(t)
				paid := event{ID: "evt_reused", Type: "payment.succeeded", OrderNo: orderNo, PaymentID: "pay_reused", Amount: total}
				b.byQueue(t, b.secret, paid, time.Now())
				require.Equal(t, queue.Ack, b.settled(t, paid.ID).Decision)
				require.Equal(t, facts{Status: "PAID", EventsApplied: 1, PaymentEvents: 1, PaymentRecords: 1}, b.facts(t, orderNo))

				// The id again, signed, claiming another order was paid:
				// twice, as a bridge forwards a copy again.
				reused := paid
				reused.OrderNo, reused.PaymentID = other, "pay_reused_other"
				for copy := 1; copy <= 2; copy++ {
					msgID := fmt.Sprintf("%s-copy%d", reused.ID, copy)
					b.publish(t, b.secret, reused, time.Now(), msgID)
					s := b.settled(t, msgID)
					require.Equal(t, queue.Ack, s.Decision, "copy %d: %s", copy, answerOf(s))
					require.Equal(t, http.StatusOK, s.Answer.Status, "copy %d: %s", copy, answerOf(s))
					var out idempotency.PaymentOutcome
					require.NoError(t, json.Unmarshal(s.Answer.Body, &out), "%s", s.Answer.Body)
					require.Equal(t, idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyPayloadMismatch}, out)
					require.Equal(t, 1, b.mismatches(t, reused.ID), "copy %d: the anomaly is recorded once", copy)
				}
				require.Zero(t, b.faultRun.settled.count(queue.DeadLetter), "nothing dead-lettered")

				// The same payload by the webhook: acknowledged, and still
				// one anomaly.
				statuses := b.byWebhook(t, reused)
				require.Equal(t, http.StatusNoContent, statuses[len(statuses)-1], "%v", statuses)
				b.mu.Lock()
				observed := b.observed[reused.ID]
				b.mu.Unlock()
				require.Equal(t, idempotency.AnomalyPayloadMismatch, observed[len(observed)-1].Outcome.Anomaly)
				require.Equal(t, 1, b.mismatches(t, reused.ID))

				require.Equal(t, facts{Status: "CREATED"}, b.facts(t, other), "never applied")
				require.Equal(t, facts{Status: "PAID", EventsApplied: 1, PaymentEvents: 1, PaymentRecords: 1}, b.facts(t, orderNo),
					"the first payload's effect, once")
				require.Equal(t, 1, b.records(t, paid.ID))
			})
		}
	}
}

// mismatches counts the payload-mismatch anomalies of event id.
func (b *paymentBundle) mismatches(t *testing.T, id string) int {
	t.Helper()
	var n int
	b.query(t, `SELECT COUNT(*) FROM payment_anomaly WHERE event_id = ? AND reason = ?`,
		[]any{id, string(idempotency.AnomalyPayloadMismatch)}, &n)
	return n
}

// A message whose signature does not hold is dead-lettered with the
// reason, before anything is written: no record, no payment, the order
// as it was. And an event of a type the order's life does not follow is
// acked without an effect.
func TestPaymentEvents_UnverifiedMessages_AreDeadLetteredWithNothingWritten(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setupPayments(t, broker(t), "mysql")
			orderNo, total := b.order(t)
			ev := func(id string) event {
				return event{ID: id, Type: "payment.succeeded", OrderNo: orderNo, PaymentID: "pay_" + id, Amount: total}
			}
			for _, tc := range []struct {
				name, reason string
				secret       string
				event        event
				at           time.Time
			}{
				{"Forged", orderqueue.ReasonSignature, newSecret(), ev("evt_forged"), time.Now()},
				{"Stale", orderqueue.ReasonStale, b.secret, ev("evt_stale"), time.Now().Add(-time.Hour)},
				{"FromTheFuture", orderqueue.ReasonStale, b.secret, ev("evt_future"), time.Now().Add(time.Hour)},
				{"Malformed", orderqueue.ReasonMalformed, b.secret, event{ID: "evt_malformed", Type: "payment.succeeded", PaymentID: "pay_x", Amount: total}, time.Now()},
			} {
				t.Run(tc.name, func(t *testing.T) {
					b.byQueue(t, tc.secret, tc.event, tc.at)
					s := b.settled(t, tc.event.ID)
					require.Equal(t, queue.DeadLetter, s.Decision, "%s", answerOf(s))
					require.Equal(t, tc.reason, s.Reason)
					require.Equal(t, http.StatusBadRequest, s.Answer.Problem.Status)
					require.Zero(t, b.records(t, tc.event.ID), "no record")
					require.Equal(t, facts{Status: "CREATED"}, b.facts(t, orderNo), "nothing written")
				})
			}

			t.Run("Ignored", func(t *testing.T) {
				e := ev("evt_ignored")
				e.Type = "customer.created"
				b.byQueue(t, b.secret, e, time.Now())
				s := b.settled(t, e.ID)
				require.Equal(t, queue.Ack, s.Decision, "%s", answerOf(s))
				require.Equal(t, facts{Status: "CREATED"}, b.facts(t, orderNo), "no effect")
			})
		})
	}
}

// PaymentConfig refuses to run without a usable secret, or without the
// service's idempotency.
func TestPaymentConfig_WithoutASecret_Fails(t *testing.T) {
	t.Parallel()
	db, store, dialect := databases[0].Open(t)
	require.NoError(t, orderservice.Setup(context.Background(), db, dialect))
	svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect})
	require.NoError(t, err)
	_, err = orderqueue.PaymentConfig(svc, orderqueue.Options{Action: orderqueue.ActionPaymentEvents})
	require.ErrorContains(t, err, "WebhookSecrets")
	_, err = orderqueue.PaymentConfig(svc, orderqueue.Options{WebhookSecrets: []string{"whsec_not base64!"}})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "not base64!", "never the secret in the error")

	plain, err := orderservice.New(db, orderservice.Options{Dialect: dialect})
	require.NoError(t, err)
	_, err = orderqueue.PaymentConfig(plain, orderqueue.Options{WebhookSecrets: []string{newSecret()}})
	require.ErrorContains(t, err, "idempotency")
}
