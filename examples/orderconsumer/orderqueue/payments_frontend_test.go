package orderqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/payment"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	"github.com/orderguard/idempotency/queue"
)

// The payment events' consumer passes the payment part of the front-end
// conformance suite, as the webhook does, on MariaDB and PostgreSQL: an
// event bridge's messages, Standard Webhooks bodies with their webhook-*
// headers, over NATS JetStream and RabbitMQ.
func TestFrontend_PaymentEventsNATS(t *testing.T) {
	t.Parallel()
	exercisePayments(t, brokertest.NATS(t))
}

func TestFrontend_PaymentEventsAMQP(t *testing.T) {
	t.Parallel()
	exercisePayments(t, brokertest.AMQP(t))
}

func exercisePayments(t *testing.T, broker string) {
	for _, db := range databases {
		frontendtest.ExercisePayments(t, db, func(t *testing.T, env *frontendtest.Env) frontendtest.PaymentFrontend {
			topo := topology(t, broker)
			f := &paymentFrontend{secret: newSecret(), settled: newSettlements()}
			consumer(t, env.Service, orderqueue.Options{
				Broker: broker, Topology: topo, Workers: 4, Action: orderqueue.ActionPaymentEvents,
				WebhookSecrets: []string{f.secret}, WebhookTolerance: 5 * time.Minute,
				RetryDelay: 200 * time.Millisecond, Backoff: queue.Backoff{Initial: 200 * time.Millisecond, Max: time.Second},
				Observe: f.settled.observe,
			})
			f.pub = publisher(t, broker, topo)
			return f
		})
	}
}

// paymentFrontend is the provider's side of the queue: a bridge that
// forwards each delivery the provider makes as a message of its own (its
// own message id: the key is webhook-id), signed with the webhook's
// secret, and reads what the consumer did with it as the answer: an ack
// is the provider's success, a negative ack an answer that says when to
// deliver again, a dead letter a refusal.
type paymentFrontend struct {
	secret  string
	pub     orderqueue.Publisher
	settled *settlements
	n       atomic.Int64
}

func (f *paymentFrontend) Deliver(ctx context.Context, c frontendtest.Callback) frontendtest.Answer {
	at, secret := time.Now(), f.secret
	claimed := c
	switch c.Flaw {
	case frontendtest.Forged:
		secret = newSecret()
	case frontendtest.Stale:
		at = at.Add(-time.Hour)
	case frontendtest.Malformed:
		c.OrderNo = ""
	case frontendtest.Tampered:
		c.Amount = 1 // what was signed
	}
	body := standardBody(c, c.Flaw == frontendtest.Oversize)
	h, err := idemstandard.Sign(secret, c.ID, at, body)
	if err != nil {
		return frontendtest.Answer{Err: err}
	}
	switch c.Flaw {
	case frontendtest.Unsigned:
		h.Del(idemstandard.SignatureHeader)
	case frontendtest.Tampered:
		body = standardBody(claimed, false)
	}
	id := fmt.Sprintf("pe-%d", f.n.Add(1))
	m := orderqueue.Message{ID: id, Body: body, Header: map[string]string{requestHeader: id}}
	for k := range h {
		m.Header[k] = h.Get(k)
	}
	settled := f.settled.expect(id)
	defer f.settled.forget(id)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := f.pub.Publish(ctx, m); err != nil {
		return frontendtest.Answer{Err: err}
	}
	var s queue.Settlement
	select {
	case s = <-settled:
	case <-ctx.Done():
		return frontendtest.Answer{Err: fmt.Errorf("the message was never settled: %w", ctx.Err())}
	}
	a := frontendtest.Answer{Status: s.Answer.Status, Raw: answerOf(s) + "\n" + string(s.Answer.Body)}
	if p := s.Answer.Problem; p != nil {
		a.Status, a.Kind = p.Status, p.Kind()
	}
	switch s.Decision {
	case queue.Nak:
		a.RetryAfter = s.Delay > 0
		if a.Status < 400 {
			a.Status = http.StatusServiceUnavailable // not done: delivered again
		}
	case queue.DeadLetter:
		a.Kind = s.Reason
	}
	return a
}

// standardBody is c's event in package idemstandard's schema; pad pads
// it past payment.MaxBodyBytes.
func standardBody(c frontendtest.Callback, pad bool) []byte {
	typ := idemstandard.TypePaymentSucceeded
	if c.Kind == payment.Refunded {
		typ = idemstandard.TypePaymentRefunded
	}
	data := map[string]any{"order_no": c.OrderNo, "payment_id": c.PaymentID, "amount": c.Amount, "currency": c.Currency}
	if c.RefundID != "" {
		data["refund_id"] = c.RefundID
	}
	if pad {
		data["note"] = strings.Repeat("x", payment.MaxBodyBytes)
	}
	raw, _ := json.Marshal(map[string]any{"type": typ, "timestamp": "2025-03-14T09:26:53Z", "data": data})
	return raw
}
