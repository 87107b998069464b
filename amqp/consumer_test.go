package idemamqp_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	idemamqp "github.com/orderguard/idempotency/amqp"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/internal/faultproxy"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/queue"
)

// testBundle is a queue of this test's own (and its dead-letter queue),
// and a Consumer of it over a fresh MariaDB database whose handler
// answers what status says (201 unless set), counting its runs.
type testBundle struct {
	url     string
	conn    *amqp.Connection
	ch      *amqp.Channel
	queue   string
	dead    string
	status  atomic.Int32
	runs    atomic.Int32
	settled chan queue.Settlement
}

// setup declares the queue with args ({"x-queue-type": "quorum"} or
// nil) and runs a consumer of it, of that QueueType, configured by edit,
// until t ends.
func setup(t *testing.T, args amqp.Table, edit func(*idemamqp.Config)) *testBundle {
	t.Helper()
	return setupMiddleware(t, args, nil, edit)
}

// setupMiddleware is setup with a Middleware configured by mwCfg.
func setupMiddleware(t *testing.T, args amqp.Table, mwCfg *idempotency.Config, edit func(*idemamqp.Config)) *testBundle {
	t.Helper()
	b := &testBundle{url: brokertest.AMQP(t), queue: brokertest.Name("idemamqp"), settled: make(chan queue.Settlement, 16)}
	b.dead = b.queue + ".dead-letter"
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), mwCfg)
	require.NoError(t, err)
	b.conn, err = amqp.Dial(b.url)
	require.NoError(t, err)
	t.Cleanup(func() { b.conn.Close() })
	require.NoError(t, idemamqp.DeclareQueue(b.conn, b.queue, args))
	b.ch, err = b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.ch.QueueDelete(b.queue, false, false, false)
		_, _ = b.ch.QueueDelete(b.dead, false, false, false)
	})
	cfg := idemamqp.Config{
		Config: queue.Config{
			Middleware: mw, Route: "POST /orders", RetryDelay: 50 * time.Millisecond,
			Backoff: queue.Backoff{Initial: 50 * time.Millisecond, Max: 50 * time.Millisecond}, MaxDeliveries: 3,
			Handler: func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
				b.runs.Add(1)
				status := int(b.status.Load())
				if status == 0 {
					status = http.StatusCreated
				}
				return idempotency.Result{Status: status, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
			},
			Observe: func(s queue.Settlement) { b.settled <- s },
		},
		URL: b.url, Queue: b.queue, DeadLetterQueue: b.dead, ReconnectDelay: 50 * time.Millisecond,
	}
	if args["x-queue-type"] == "quorum" {
		cfg.QueueType = idemamqp.QuorumQueue
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := idemamqp.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return b
}

func (b *testBundle) publish(t *testing.T, p amqp.Publishing) {
	t.Helper()
	p.ContentType = "application/json"
	require.NoError(t, b.ch.PublishWithContext(context.Background(), "", b.queue, false, false, p))
}

func (b *testBundle) next(t *testing.T) queue.Settlement {
	t.Helper()
	select {
	case s := <-b.settled:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("no message settled within 30s")
	}
	return queue.Settlement{}
}

// depth is how many messages wait in name, ready.
func (b *testBundle) depth(t *testing.T, name string) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(name, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func TestADeadLetter_IsConfirmedInItsQueueWithTheReason_ThenTheMessageAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, nil)
	b.publish(t, amqp.Publishing{MessageId: "m1", Headers: amqp.Table{"Idempotency-Key": "two words"}, Body: []byte(`{"a":1}`)})
	s := b.next(t)
	require.Equal(t, queue.DeadLetter, s.Decision, "%+v", s)
	dl, ok, err := b.ch.Get(b.dead, true)
	require.NoError(t, err)
	require.True(t, ok, "the dead letter is in its queue")
	require.Equal(t, `{"a":1}`, string(dl.Body))
	require.Equal(t, "m1", dl.MessageId)
	require.Equal(t, idempotency.ProblemInvalidKey, dl.Headers[queue.ReasonHeader])
	require.Equal(t, "400", dl.Headers[queue.DeadStatusHeader])
	require.Equal(t, b.queue, dl.Headers[queue.SourceHeader])
	require.Equal(t, "two words", dl.Headers["Idempotency-Key"], "the message's own headers are kept")
	require.Equal(t, uint8(amqp.Persistent), dl.DeliveryMode)
	require.Zero(t, b.depth(t, b.queue), "the message left its queue")
}

// A delayed nack holds the delivery, then requeues it; a quorum queue
// counts the deliveries.
func TestANakedMessage_IsRequeuedAfterItsDelay_AQuorumQueueCountsIt(t *testing.T) {
	t.Parallel()
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, nil)
	b.status.Store(http.StatusInternalServerError)
	b.publish(t, amqp.Publishing{MessageId: "m1", Body: []byte(`{"a":1}`)})
	first := b.next(t)
	require.Equal(t, queue.Nak, first.Decision)
	require.Equal(t, 1, first.Message.Delivery)
	b.status.Store(http.StatusCreated)
	second := b.next(t)
	require.Equal(t, queue.Ack, second.Decision, "%+v", second)
	require.Equal(t, 2, second.Message.Delivery, "x-delivery-count + 1")
	require.EqualValues(t, 2, b.runs.Load())
}

// A classic queue counts no deliveries: the consumer counts those it saw,
// and dead-letters at MaxDeliveries all the same.
func TestOnAClassicQueue_TheConsumerCountsDeliveries_AndDeadLettersAtTheMaximum(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	b.status.Store(http.StatusInternalServerError)
	b.publish(t, amqp.Publishing{MessageId: "m1", Body: []byte(`{"a":1}`)})
	var decisions []string
	for range 3 {
		s := b.next(t)
		decisions = append(decisions, s.Decision.String()+" "+s.Reason)
	}
	require.Equal(t, []string{"nak ", "nak ", "dead-letter " + queue.ReasonMaxDeliveries}, decisions)
	dl, ok, err := b.ch.Get(b.dead, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "3", dl.Headers[queue.DeliveriesHeader])
	require.Equal(t, "500", dl.Headers[queue.DeadStatusHeader])
}

func TestAMessageThatAsksForAReply_GetsTheAnswerWithItsCorrelationID(t *testing.T) {
	t.Parallel()
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, nil)
	replies, err := b.ch.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	require.NoError(t, err)
	for i := range 2 {
		b.publish(t, amqp.Publishing{MessageId: "m1", CorrelationId: "c" + string(rune('0'+i)),
			ReplyTo: "amq.rabbitmq.reply-to", Body: []byte(`{"a":1}`)})
		select {
		case r := <-replies:
			require.Equal(t, "201", r.Headers[queue.StatusHeader])
			require.Equal(t, "application/json", r.ContentType)
			require.Equal(t, "c"+string(rune('0'+i)), r.CorrelationId)
			require.Equal(t, `{"ok":true}`, string(r.Body))
			if i == 1 {
				require.Equal(t, "true", r.Headers[queue.ReplayedHeader], "the second is the record's")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no reply")
		}
	}
	require.EqualValues(t, 1, b.runs.Load())
}

// A connection reset between the commit and the ack: the ack is lost, the
// broker requeues the message, the consumer dials again and acks its
// replay. One run.
func TestAConnectionLostBeforeTheAck_IsDialledAgain_TheRedeliveryReplays(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(brokertest.AMQP(t))
	require.NoError(t, err)
	proxy, err := faultproxy.Start(u.Host, faultproxy.WithProtocol(faultproxy.Opaque))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	var cut atomic.Bool
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, func(c *idemamqp.Config) {
		viaProxy := *u
		viaProxy.Host = proxy.Addr()
		c.URL = viaProxy.String()
		c.BeforeSettle = func(s queue.Settlement) {
			if s.Decision == queue.Ack && !s.Answer.Replayed && cut.CompareAndSwap(false, true) {
				proxy.Reset()
			}
		}
	})
	b.publish(t, amqp.Publishing{MessageId: "m1", Body: []byte(`{"a":1}`)})
	first := b.next(t)
	require.Equal(t, queue.Ack, first.Decision)
	t.Logf("the first ack, on a reset connection: %v", first.Err)
	second := b.next(t)
	require.Equal(t, queue.Ack, second.Decision, "%+v", second)
	require.True(t, second.Answer.Replayed, "the redelivery replays the committed run")
	require.NoError(t, second.Err)
	require.EqualValues(t, 1, b.runs.Load())
}
