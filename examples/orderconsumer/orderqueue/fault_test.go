package orderqueue_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/internal/faultproxy"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/queue"
)

// databases are the engines every fault runs on.
var databases = []frontendtest.Database{frontendtest.MySQL, pgtest.Database}

// brokers are the shared brokers, by kind.
func brokers(t *testing.T) map[string]func(t testing.TB) string {
	return map[string]func(t testing.TB) string{"nats": brokertest.NATS, "amqp": brokertest.AMQP}
}

// faultRun is one run of a fault: a fresh database and order service, a
// topology of its own, and the counts the run prints.
type faultRun struct {
	broker  string
	topo    orderqueue.Topology
	db      *sql.DB
	dialect string
	svc     *orderservice.Service
	settled *settlements

	published atomic.Int64 // publishes the broker confirmed
	deduped   atomic.Int64 // of them, dropped by JetStream as copies of an id
	mu        sync.Mutex
	sent      []string // the request of every message stored
}

func newFaultRun(t *testing.T, broker string, db frontendtest.Database, mode idempotency.Mode) *faultRun {
	t.Helper()
	sqlDB, store, dialect := db.Open(t)
	require.NoError(t, orderservice.Setup(context.Background(), sqlDB, dialect))
	svc, err := orderservice.New(sqlDB, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect,
		Config: idempotency.Config{Mode: mode, Lease: 5 * time.Second}})
	require.NoError(t, err)
	return &faultRun{broker: broker, topo: topology(t, broker), db: sqlDB, dialect: dialect, svc: svc, settled: newSettlements()}
}

// options are a consumer's of the run, quick to redeliver.
func (r *faultRun) options() orderqueue.Options {
	return orderqueue.Options{
		Broker: r.broker, Topology: r.topo, Workers: 4, AckWait: 2 * time.Second,
		RetryDelay: 100 * time.Millisecond, Backoff: queue.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
		Observe: r.settled.observe,
	}
}

// message is the create of the n-th id: user 7, one of SKU 20001, the id
// as the message id and no key header, so that the id is the key.
func message(id string) orderqueue.Message {
	return orderqueue.Message{User: "7", ID: id, Body: createBody(7, orderservice.FirstSKU, 1, nil)}
}

func (r *faultRun) publish(t *testing.T, pub orderqueue.Publisher, m orderqueue.Message) {
	t.Helper()
	req := strconv.FormatInt(requests.Add(1), 10)
	m.Header = map[string]string{requestHeader: req}
	dup, err := pub.Publish(context.Background(), m)
	require.NoError(t, err)
	r.published.Add(1)
	if dup {
		r.deduped.Add(1)
		return
	}
	r.mu.Lock()
	r.sent = append(r.sent, req)
	r.mu.Unlock()
}

// requests numbers every message the tests publish.
var requests atomic.Int64

// ordersByKey counts the orders of each key.
func (r *faultRun) ordersByKey(t *testing.T) map[string]int {
	t.Helper()
	rows, err := r.db.Query(`SELECT idempotency_key, COUNT(*) FROM purchase_order GROUP BY idempotency_key`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		out[k] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// drained waits until every id has its order and every message stored is
// settled: its last final settlement went through (acked or
// dead-lettered), and the broker holds nothing of it (JetStream: nothing
// pending or unacked; RabbitMQ: nothing ready).
func (r *faultRun) drained(t *testing.T, ids []string) {
	t.Helper()
	ctx := context.Background()
	var js jetstream.JetStream
	if strings.HasPrefix(r.broker, "nats://") {
		nc, err := orderqueue.ConnectNATS(r.broker)
		require.NoError(t, err)
		defer nc.Close()
		js, _ = jetstream.New(nc)
	}
	brokerEmpty := func() bool {
		if js != nil {
			c, err := js.Consumer(ctx, r.topo.Stream, r.topo.Durable)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}
		conn, err := amqp.Dial(r.broker)
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		q, err := ch.QueueDeclarePassive(r.topo.Queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	}
	require.Eventually(t, func() bool {
		orders := r.ordersByKey(t)
		for _, id := range ids {
			if orders[id] == 0 {
				return false
			}
		}
		return r.unsettled() == 0 && brokerEmpty()
	}, 90*time.Second, 20*time.Millisecond, "not every id has its order, or not every message was settled (%d unsettled)", r.unsettled())
}

// unsettled is how many stored messages have no final settlement that
// went through.
func (r *faultRun) unsettled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, req := range r.sent {
		if !r.settled.settledFinally(req) {
			n++
		}
	}
	return n
}

// report prints the run's counts and checks what must hold: one order
// per id, every message settled, nothing dead-lettered.
func (r *faultRun) report(t *testing.T, ids []string, extra string) {
	t.Helper()
	orders := r.ordersByKey(t)
	for _, id := range ids {
		require.Equal(t, 1, orders[id], "id %s: exactly one order (all: %v)", id, orders)
	}
	total := 0
	for _, n := range orders {
		total += n
	}
	redelivered := 0
	r.settled.mu.Lock()
	for _, ss := range r.settled.byKey {
		for _, s := range ss {
			if s.Message.Delivery > 1 {
				redelivered++
			}
		}
	}
	delivered := r.settled.counts[queue.Ack] + r.settled.counts[queue.Nak] + r.settled.counts[queue.DeadLetter]
	acked := r.settled.counts[queue.Ack]
	dead := r.settled.counts[queue.DeadLetter]
	ackErrs := 0
	for _, ss := range r.settled.byKey {
		for _, s := range ss {
			if s.Decision == queue.Ack && s.Err != nil {
				ackErrs++
			}
		}
	}
	r.settled.mu.Unlock()
	require.Zero(t, dead, "nothing dead-lettered")
	require.Len(t, orders, len(ids), "no order for anything but the ids")
	t.Logf("%s counts: published=%d (deduplicated by the broker %d) delivered=%d redelivered=%d orders=%d acked=%d (of which the ack failed %d) dead-lettered=%d %s",
		t.Name(), r.published.Load(), r.deduped.Load(), delivered, redelivered, total, acked, ackErrs, dead, extra)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// The broker connection is reset between a message's commit and its ack
// (a TCP proxy in front of the broker), again and again: the ack is lost
// (RabbitMQ requeues every unacked delivery of the connection) or sent
// late (nats.go buffers it while it reconnects; unsent within AckWait,
// JetStream delivers the message again), and each delivery after the
// first finds its record.
func TestFault_TheBrokerConnectionCutBetweenCommitAndAck_OneOrderPerID(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				target := broker(t)
				u, err := url.Parse(target)
				require.NoError(t, err)
				proxy, err := faultproxy.Start(u.Host, faultproxy.WithProtocol(faultproxy.Opaque))
				require.NoError(t, err)
				t.Cleanup(func() { proxy.Close() })
				r := newFaultRun(t, target, db, idempotency.ModeClaimFirst)
				const cuts = 3
				var done atomic.Int64
				opts := r.options()
				opts.Workers = 1 // one commit at a time: each cut meets the connection of its own
				viaProxy := *u
				viaProxy.Host = proxy.Addr()
				opts.Broker = viaProxy.String()
				opts.BeforeSettle = func(s queue.Settlement) {
					if s.Decision == queue.Ack && !s.Answer.Replayed && done.Load() < cuts && proxy.Reset() > 0 {
						done.Add(1)
					}
				}
				consumer(t, r.svc, opts)
				pub := publisher(t, target, r.topo)
				want := ids("cut", 24)
				for _, id := range want {
					r.publish(t, pub, message(id))
				}
				r.drained(t, want)
				r.report(t, want, fmt.Sprintf("connections reset between a commit and its ack=%d", done.Load()))
				require.Positive(t, done.Load(), "at least one cut met an open connection")
			})
		}
	}
}

// Every id is published many times, from several publishers at once:
// one order per id, every copy acked. JetStream drops the copies of an id
// it sees within its stream's Duplicates window; the run publishes each
// id again once that window has passed, as a publisher retrying later
// does, so that copies do reach the consumer.
func TestFault_TheSameIDPublishedManyTimes_OneOrderPerID(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				r := newFaultRun(t, broker(t), db, idempotency.ModeSinglePhase)
				if kind == "nats" {
					shortDuplicatesWindow(t, r)
				}
				consumer(t, r.svc, r.options())
				pub := publisher(t, r.broker, r.topo)
				want := ids("same", 8)
				const rounds, copies = 3, 4
				for round := range rounds {
					var wg sync.WaitGroup
					for _, id := range want {
						for range copies {
							wg.Go(func() { r.publish(t, pub, message(id)) })
						}
					}
					wg.Wait()
					if round < rounds-1 && kind == "nats" {
						time.Sleep(duplicatesWindow) // past the broker's window, not an interleaving
					}
				}
				r.drained(t, want)
				r.report(t, want, "")
				require.Greater(t, r.settled.count(queue.Ack), len(want), "copies reached the consumer and were acked")
			})
		}
	}
}

// duplicatesWindow is the shortest JetStream allows.
const duplicatesWindow = 100 * time.Millisecond

func shortDuplicatesWindow(t *testing.T, r *faultRun) {
	t.Helper()
	nc, err := orderqueue.ConnectNATS(r.broker)
	require.NoError(t, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	s, err := js.Stream(ctx, r.topo.Stream)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.Duplicates = duplicatesWindow
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
}

// Three consumers share one durable consumer (one queue); every id is
// published three times at once: one order per id.
func TestFault_SeveralConsumersShareTheStream_OneOrderPerID(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		for _, db := range databases {
			t.Run(kind+"/"+db.Name(), func(t *testing.T) {
				t.Parallel()
				r := newFaultRun(t, broker(t), db, idempotency.ModeClaimFirst)
				perConsumer := make([]atomic.Int64, 3)
				for i := range perConsumer {
					opts := r.options()
					opts.Workers = 2
					observe := opts.Observe
					opts.Observe = func(s queue.Settlement) { perConsumer[i].Add(1); observe(s) }
					consumer(t, r.svc, opts)
				}
				pub := publisher(t, r.broker, r.topo)
				want := ids("shared", 16)
				var wg sync.WaitGroup
				for _, id := range want {
					for c := range 3 {
						m := message(id)
						m.Key, m.ID = id, fmt.Sprintf("%s-copy%d", id, c) // one key, distinct ids: no broker deduplication
						wg.Go(func() { r.publish(t, pub, m) })
					}
				}
				wg.Wait()
				r.drained(t, want)
				r.report(t, want, fmt.Sprintf("per consumer=%d/%d/%d", perConsumer[0].Load(), perConsumer[1].Load(), perConsumer[2].Load()))
			})
		}
	}
}

// A used id with another payload is never processed: it is dead-lettered
// with the reason in its headers, and its publisher hears why.
func TestFault_AChangedPayloadUnderAUsedID_IsDeadLetteredWithTheReason(t *testing.T) {
	t.Parallel()
	for kind, broker := range brokers(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			r := newFaultRun(t, broker(t), frontendtest.MySQL, idempotency.ModeClaimFirst)
			consumer(t, r.svc, r.options())
			pub := publisher(t, r.broker, r.topo)
			first, err := orderqueue.Request(context.Background(), pub, message("used"))
			require.NoError(t, err)
			require.Equal(t, 201, first.Status)
			changed := message("used")
			changed.Body = createBody(7, orderservice.FirstSKU, 5, nil)
			if kind == "nats" {
				changed.Key, changed.ID = "used", "used-again" // past JetStream's deduplication of the id
			}
			reply, err := orderqueue.Request(context.Background(), pub, changed)
			require.NoError(t, err)
			require.Equal(t, 409, reply.Status, "%s", reply.Body)
			require.Contains(t, string(reply.Body), idempotency.ProblemKeyReused)
			require.Equal(t, map[string]int{"used": 1}, r.ordersByKey(t), "the changed payload was never processed")
			// The reply goes out before the dead letter is stored: wait for it.
			require.Eventually(t, func() bool { return r.settled.count(queue.DeadLetter) == 1 }, 30*time.Second,
				5*time.Millisecond, "the changed payload was dead-lettered")
			h := deadLetter(t, r)
			require.Equal(t, idempotency.ProblemKeyReused, h[queue.ReasonHeader])
			require.Equal(t, "409", h[queue.DeadStatusHeader])
			require.Contains(t, h[queue.DetailHeader], "reused")
			t.Logf("dead letter headers: %v", h)
		})
	}
}

// deadLetter reads the one dead letter of the run, its headers as text.
func deadLetter(t *testing.T, r *faultRun) map[string]string {
	t.Helper()
	ctx := context.Background()
	h := map[string]string{}
	if strings.HasPrefix(r.broker, "nats://") {
		nc, err := orderqueue.ConnectNATS(r.broker)
		require.NoError(t, err)
		defer nc.Close()
		js, _ := jetstream.New(nc)
		s, err := js.Stream(ctx, r.topo.DeadLetterStream)
		require.NoError(t, err)
		m, err := s.GetLastMsgForSubject(ctx, r.topo.DeadLetterSubject)
		require.NoError(t, err)
		for k := range m.Header {
			h[k] = m.Header.Get(k)
		}
		return h
	}
	conn, err := amqp.Dial(r.broker)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get(r.topo.DeadLetterQueue, true)
	require.NoError(t, err)
	require.True(t, ok, "a dead letter in %s", r.topo.DeadLetterQueue)
	for k, v := range d.Headers {
		h[k] = fmt.Sprint(v)
	}
	return h
}

// The broker is restarted in the middle of a run (a broker of the test's
// own: nats-server stopped and started again on its store; RabbitMQ's
// application stopped and started in its node), stopped between a
// message's commit and its ack while other messages are on their way:
// half the messages are published before, the other half while it is
// down, by a publisher that retries every message the broker did not
// confirm, with its id. One order per id, every message acked.
func TestFault_TheBrokerRestartedMidRun_OneOrderPerID(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"nats", "amqp"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var srv *brokertest.Server
			if kind == "nats" {
				srv = brokertest.StartNATS(t)
			} else {
				srv = brokertest.StartRabbitMQ(t)
			}
			for _, db := range databases { // one after the other, on the one broker
				t.Run(db.Name(), func(t *testing.T) {
					r := newFaultRun(t, srv.URL, db, idempotency.ModeSinglePhase)
					opts := r.options()
					var committed atomic.Int64
					stopped := make(chan struct{})
					opts.BeforeSettle = func(s queue.Settlement) {
						if s.Decision == queue.Ack && !s.Answer.Replayed && committed.Add(1) == 10 {
							srv.Stop() // between this message's commit and its ack
							close(stopped)
						}
					}
					consumer(t, r.svc, opts)
					want := ids("restart", 40)
					var retries atomic.Int64
					pub := &retryingPublisher{broker: srv.URL, topo: r.topo}
					defer pub.close()
					publish := func(ids []string) {
						for _, id := range ids {
							retries.Add(int64(pub.publish(t, r, message(id))))
						}
					}
					publish(want[:len(want)/2])
					<-stopped
					published := make(chan struct{})
					go func() { defer close(published); publish(want[len(want)/2:]) }() // retried until the broker is back
					srv.Start()
					<-published
					r.drained(t, want)
					r.report(t, want, fmt.Sprintf("publishes retried=%d", retries.Load()))
				})
			}
		})
	}
}

// retryingPublisher publishes as a publisher that must not lose a message
// does: until the broker confirms it, dialling again after a lost
// connection, with the same id.
type retryingPublisher struct {
	broker string
	topo   orderqueue.Topology
	pub    orderqueue.Publisher
}

// publish publishes m and returns how many tries failed first.
func (p *retryingPublisher) publish(t *testing.T, r *faultRun, m orderqueue.Message) int {
	deadline := time.Now().Add(90 * time.Second)
	for failed := 0; ; failed++ {
		if time.Now().After(deadline) {
			t.Errorf("message %s: the broker never confirmed it", m.ID)
			return failed
		}
		if p.pub == nil {
			pub, err := orderqueue.Dial(p.broker, p.topo)
			if err != nil {
				time.Sleep(50 * time.Millisecond) // a publisher's pause before it dials again
				continue
			}
			p.pub = pub
		}
		req := strconv.FormatInt(requests.Add(1), 10)
		m.Header = map[string]string{requestHeader: req}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		dup, err := p.pub.Publish(ctx, m)
		cancel()
		if err != nil {
			p.close()
			time.Sleep(50 * time.Millisecond) // a publisher's pause before it tries again
			continue
		}
		r.published.Add(1)
		if dup {
			r.deduped.Add(1)
		} else {
			r.mu.Lock()
			r.sent = append(r.sent, req)
			r.mu.Unlock()
		}
		return failed
	}
}

func (p *retryingPublisher) close() {
	if p.pub != nil {
		p.pub.Close()
		p.pub = nil
	}
}
