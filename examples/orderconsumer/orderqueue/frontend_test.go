package orderqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/queue"
)

// Both consumers pass the conformance suite on MariaDB and PostgreSQL,
// one message at a time.
func TestFrontend_NATS(t *testing.T) {
	t.Parallel()
	exercise(t, brokertest.NATS(t), 1)
}

func TestFrontend_AMQP(t *testing.T) {
	t.Parallel()
	exercise(t, brokertest.AMQP(t), 1)
}

// And in batches: a storm of one key is then taken several messages at a
// time, whose duplicates DoBatch holds back until the first has
// committed.
func TestFrontend_NATSBatched(t *testing.T) {
	t.Parallel()
	exercise(t, brokertest.NATS(t), 8)
}

func exercise(t *testing.T, broker string, batch int) {
	for _, db := range []frontendtest.Database{frontendtest.MySQL, pgtest.Database} {
		frontendtest.Exercise(t, db, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
			topo := topology(t, broker)
			f := &queueFrontend{settled: newSettlements()}
			consumer(t, env.Service, orderqueue.Options{
				Broker: broker, Topology: topo, BatchSize: batch, Workers: 4,
				RetryDelay: 200 * time.Millisecond, Backoff: queue.Backoff{Initial: 200 * time.Millisecond, Max: time.Second},
				Observe: f.settled.observe,
			})
			f.pub = publisher(t, broker, topo)
			return f
		})
	}
}

// queueFrontend is the suite's client over a queue: it publishes the
// create with a reply asked for, and reads what the consumer did with
// the message (Observe) as the contract's answer: a negative ack is the
// answer that says when to retry (409 in-progress, 503), a final
// decision is its reply, read as the HTTP answer it carries.
type queueFrontend struct {
	pub     orderqueue.Publisher
	settled *settlements
	n       atomic.Int64
}

func (f *queueFrontend) Create(ctx context.Context, r frontendtest.Request) frontendtest.Answer {
	id := strconv.FormatInt(f.n.Add(1), 10)
	body := map[string]any{"user_id": r.User, "sku_id": r.SKU, "quantity": r.Quantity}
	if r.Coupon != nil {
		body["coupon_id"] = *r.Coupon
	}
	if r.Oversize {
		body["note"] = strings.Repeat("x", 2<<20)
	}
	raw, _ := json.Marshal(body)
	settled := f.settled.expect(id)
	defer f.settled.forget(id)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	pending, err := f.pub.Send(ctx, orderqueue.Message{
		User: strconv.FormatInt(r.User, 10), Key: r.Key, Body: raw, Header: map[string]string{requestHeader: id},
	})
	if errors.Is(err, nats.ErrMaxPayload) {
		// The broker refuses it before any consumer sees it: the
		// transport's own limit, as a proxy's 413 in front of an HTTP
		// server.
		return frontendtest.Answer{Status: http.StatusRequestEntityTooLarge, Kind: idempotency.ProblemBodyTooLarge,
			Raw: "publish refused: " + err.Error()}
	}
	if err != nil {
		return frontendtest.Answer{Err: err}
	}
	defer pending.Close()
	var s queue.Settlement
	select {
	case s = <-settled:
	case <-ctx.Done():
		return frontendtest.Answer{Err: fmt.Errorf("the message was never settled: %w", ctx.Err())}
	}
	if s.Decision == queue.Nak {
		a := frontendtest.Answer{Status: s.Answer.Status, RetryAfter: s.Delay > 0, Raw: "nak " + answerOf(s)}
		if p := s.Answer.Problem; p != nil {
			a.Status, a.Kind = p.Status, p.Kind()
		} else {
			a.Kind = frontendtest.HTTPAnswer(a.Status, http.Header{}, s.Answer.Body).Kind
		}
		return a
	}
	reply, err := pending.Wait(ctx)
	if err != nil {
		return frontendtest.Answer{Err: fmt.Errorf("settled %s, but: %w", answerOf(s), err)}
	}
	h := http.Header{}
	for k, v := range reply.Header {
		h.Set(k, v)
	}
	return frontendtest.HTTPAnswer(reply.Status, h, reply.Body)
}
