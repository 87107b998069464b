package orderqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/queue"
)

// topology returns names of this test's own on broker, created now and
// deleted when t ends.
func topology(t *testing.T, broker string) orderqueue.Topology {
	t.Helper()
	stream := brokertest.Name("ORDERS")
	topo := orderqueue.NamedTopology(stream, "test."+stream+".create", "orderconsumer", brokertest.Name("orders.create"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, orderqueue.EnsureTopology(ctx, broker, topo))
	t.Cleanup(func() { deleteTopology(t, broker, topo) })
	return topo
}

func deleteTopology(t *testing.T, broker string, topo orderqueue.Topology) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if strings.HasPrefix(broker, "nats://") {
		nc, err := orderqueue.ConnectNATS(broker)
		if err != nil {
			t.Logf("delete streams: %v", err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		_ = js.DeleteStream(ctx, topo.Stream)
		_ = js.DeleteStream(ctx, topo.DeadLetterStream)
		return
	}
	conn, err := amqp.Dial(broker)
	if err != nil {
		t.Logf("delete queues: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(topo.Queue, false, false, false)
	_, _ = ch.QueueDelete(topo.DeadLetterQueue, false, false, false)
}

// consumer runs svc's consumer with opts (Broker and Topology filled in)
// until t ends.
func consumer(t *testing.T, svc *orderservice.Service, opts orderqueue.Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- orderqueue.Run(ctx, svc, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "the consumer ended")
		case <-time.After(60 * time.Second):
			t.Error("the consumer did not stop within 60s")
		}
	})
}

// publisher dials topo's broker until t ends.
func publisher(t *testing.T, broker string, topo orderqueue.Topology) orderqueue.Publisher {
	t.Helper()
	pub, err := orderqueue.Dial(broker, topo)
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	return pub
}

// settlements hands each delivery's settlement to whoever waits for the
// message it carries, by its RequestHeader; later deliveries of it are
// counted only.
type settlements struct {
	mu      sync.Mutex
	waiting map[string]chan queue.Settlement
	counts  map[queue.Decision]int
	byKey   map[string][]queue.Settlement
	final   map[string]error // by request: the last final settlement's error
}

// requestHeader ties a published message to its settlements.
const requestHeader = "Test-Request"

func newSettlements() *settlements {
	return &settlements{waiting: map[string]chan queue.Settlement{}, counts: map[queue.Decision]int{},
		byKey: map[string][]queue.Settlement{}, final: map[string]error{}}
}

func (s *settlements) observe(st queue.Settlement) {
	id, _ := st.Message.HeaderValue(requestHeader)
	key, _ := st.Message.HeaderValue(queue.KeyHeader)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[st.Decision]++
	if key == "" {
		key = st.Message.ID
	}
	s.byKey[key] = append(s.byKey[key], st)
	if st.Decision != queue.Nak {
		s.final[id] = st.Err
	}
	if c := s.waiting[id]; c != nil {
		delete(s.waiting, id)
		c <- st
	}
}

// expect returns the channel the first settlement of request id arrives on.
func (s *settlements) expect(id string) <-chan queue.Settlement {
	c := make(chan queue.Settlement, 1)
	s.mu.Lock()
	s.waiting[id] = c
	s.mu.Unlock()
	return c
}

func (s *settlements) forget(id string) {
	s.mu.Lock()
	delete(s.waiting, id)
	s.mu.Unlock()
}

// settledFinally reports whether request id's last final settlement went
// through: the broker has it acked or dead-lettered, unless it lost an
// ack that reported no error.
func (s *settlements) settledFinally(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	err, ok := s.final[id]
	return ok && err == nil
}

// count returns how many settlements made decision d.
func (s *settlements) count(d queue.Decision) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[d]
}

// of returns the settlements of the messages of key, in order.
func (s *settlements) of(key string) []queue.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]queue.Settlement(nil), s.byKey[key]...)
}

// createBody is a POST /orders body.
func createBody(user, sku int64, quantity int, coupon *int64) []byte {
	body := map[string]any{"user_id": user, "sku_id": sku, "quantity": quantity}
	if coupon != nil {
		body["coupon_id"] = *coupon
	}
	raw, _ := json.Marshal(body)
	return raw
}

// answerOf is a settlement's answer status.
func answerOf(s queue.Settlement) string {
	a := s.Answer
	if a.Problem != nil {
		return fmt.Sprintf("%s %d %s", s.Decision, a.Problem.Status, a.Problem.Kind())
	}
	return fmt.Sprintf("%s %d replayed=%v", s.Decision, a.Status, a.Replayed)
}
