package idemnats_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/brokertest"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// On shutdown every message the Consumer took and did not begin is handed
// back at once, those waiting for a worker and those still in the
// client's prefetch buffer alike: another consumer of the durable gets
// them within seconds, not after AckWait, while a worker still does its
// own.
func TestOnShutdown_TheMessagesNotBegun_AreDeliveredAgainAtOnce_NotAfterAckWait(t *testing.T) {
	t.Parallel()
	const n = 20
	s := startShutdown(t, n)

	s.r.cancel()
	got := s.fetchHandedBack(t)
	require.Len(t, got, n-1, "every message but the worker's, within seconds: %v", got)
	require.False(t, got[s.inWorker], "the worker's message is its own until it settles")

	s.finish(t)
}

// The messages not begun are handed back even when no pull request waits
// for them as they are: they wait for the next one, which gets every one
// at once. A server before 2.10.16 that took a naked message for a pull
// request the Consumer had left standing, and found nobody subscribed to
// it any more, kept that message until AckWait: the Consumer has the
// server drop those pull requests before it naks.
func TestOnShutdown_TheMessagesNotBegun_AwaitTheNextPullRequest_WhenNoneWaits(t *testing.T) {
	t.Parallel()
	const n = 20
	s := startShutdown(t, n)
	// A connection of its own sees the naks the Consumer sends.
	spy, err := nats.Connect(brokertest.NATS(t))
	require.NoError(t, err)
	t.Cleanup(spy.Close)
	naks := make(chan string, 2*n)
	_, err = spy.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		if string(m.Data) == "-NAK" && strings.Contains(m.Subject, "."+s.b.stream+".") {
			naks <- m.Subject
		}
	})
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	s.r.cancel()
	for i := range n - 1 {
		select {
		case <-naks:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of the %d messages not begun were naked within 30s", i, n-1)
		}
	}
	// Every nak has reached the server before anyone asks for a message.
	got := s.fetchHandedBack(t)
	require.Len(t, got, n-1, "every message but the worker's, within seconds: %v", got)
	require.False(t, got[s.inWorker], "the worker's message is its own until it settles")

	s.finish(t)
}

// shutdown is a Consumer of n messages with one worker, which holds the
// first message it begins until finish: the others are taken, one waiting
// for the worker and the rest in the client's prefetch buffer.
type shutdown struct {
	n        int
	b        *testBundle
	r        *running
	began    chan string
	unblock  func()
	inWorker string
}

// startShutdown publishes n messages, starts the Consumer and returns once
// its worker began one and the Consumer took them all.
func startShutdown(t *testing.T, n int) *shutdown {
	t.Helper()
	s := &shutdown{n: n, began: make(chan string, n)}
	release := make(chan struct{})
	s.b = newBundle(t, func(c *idemnats.Config) {
		c.Workers, c.BatchSize, c.Prefetch = 1, 1, 2*n
		handler := c.Handler
		c.Handler = func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
			key, _ := m.HeaderValue("Idempotency-Key")
			s.began <- key
			<-release
			return handler(ctx, tx, m)
		}
	})
	s.b.create(t, func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Minute })
	for i := range n {
		s.b.publish(t, nats.Header{"Idempotency-Key": {fmt.Sprintf("k%d", i)}}, `{"a":1}`)
	}
	s.r = s.b.start(t)
	s.unblock = sync.OnceFunc(func() { close(release) })
	t.Cleanup(s.unblock) // before the Run's own cleanup waits for it

	select {
	case s.inWorker = <-s.began:
	case <-time.After(30 * time.Second):
		t.Fatal("no message began within 30s")
	}
	require.Eventually(t, func() bool {
		info, err := s.b.cons.Info(context.Background())
		return err == nil && info.NumAckPending == n
	}, 30*time.Second, 10*time.Millisecond, "the Consumer took every message: one in its worker, the rest waiting")
	return s
}

// fetchHandedBack fetches, as another consumer of the durable, what is
// delivered within 10 seconds (AckWait is a minute), up to n-1 messages,
// acks each, and returns their keys.
func (s *shutdown) fetchHandedBack(t *testing.T) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second) // AckWait is a minute
	for len(got) < s.n-1 && time.Now().Before(deadline) {
		batch, err := s.b.cons.Fetch(s.n-1-len(got), jetstream.FetchMaxWait(time.Until(deadline)))
		require.NoError(t, err)
		for msg := range batch.Messages() {
			got[msg.Headers().Get("Idempotency-Key")] = true
			require.NoError(t, msg.Ack())
		}
	}
	return got
}

// finish lets the worker settle its message and waits for Run to return.
func (s *shutdown) finish(t *testing.T) {
	t.Helper()
	s.unblock()
	require.NoError(t, s.r.wait())
	require.Empty(t, s.began, "no other message began")
}
