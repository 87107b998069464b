package orderqueue_test

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/queue"
)

// quorumLimit is the delivery limit of RabbitMQ 4's quorum queues, unless
// a queue says otherwise.
const quorumLimit = 20

// The consumer requeues a message without limit while another consumer
// holds its key; a quorum queue's own delivery limit (RabbitMQ 4: 20 by
// default) must not drop it meanwhile. On the example's topology the
// message is delivered until it is done (RabbitMQ 4: the limit lifted) or,
// where a limit applies all the same, moved to the dead letters' queue.
// Never lost.
func TestAMQPTopology_AMessageRequeuedPastTheDeliveryLimit_IsNotLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := brokertest.AMQP(t)
	topo := topology(t, broker)
	limit := deliveryLimit(t, broker, topo.Queue)

	sqlDB, store, dialect := frontendtest.MySQL.Open(t)
	require.NoError(t, orderservice.Setup(ctx, sqlDB, dialect))
	held, release := make(chan struct{}), make(chan struct{})
	var holding atomic.Bool
	svc, err := orderservice.New(sqlDB, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect,
		AfterCreate: func(ctx context.Context) error { // the original holds its key until released
			if holding.CompareAndSwap(false, true) {
				close(held)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		},
		Config: idempotency.Config{Mode: idempotency.ModeClaimFirst, Lease: time.Minute}})
	require.NoError(t, err)

	var naks atomic.Int32
	duplicateDone := make(chan queue.Settlement, 1)
	consumer(t, svc, orderqueue.Options{Broker: broker, Topology: topo, Workers: 2, RetryDelay: time.Millisecond,
		Observe: func(s queue.Settlement) {
			if id, _ := s.Message.HeaderValue(requestHeader); id != "duplicate" {
				return
			}
			if s.Decision == queue.Nak {
				naks.Add(1)
				return
			}
			duplicateDone <- s
		}})
	pub := publisher(t, broker, topo)
	send := func(request string) {
		_, err := pub.Publish(ctx, orderqueue.Message{User: "7", Key: "past-the-limit",
			Body: createBody(7, orderservice.FirstSKU, 1, nil), Header: map[string]string{requestHeader: request}})
		require.NoError(t, err)
	}
	send("original")
	<-held
	send("duplicate") // meets the key in progress, requeued again and again

	deadLetters := queueDepth(t, broker, topo.DeadLetterQueue)
	require.Eventually(t, func() bool { return naks.Load() > quorumLimit+4 || deadLetters() > 0 }, 30*time.Second,
		5*time.Millisecond, "the duplicate is neither delivered again nor in the dead letters: lost")
	close(release)

	var done queue.Settlement
	require.Eventually(t, func() bool {
		select {
		case done = <-duplicateDone:
			return true
		default:
			return deadLetters() > 0
		}
	}, 60*time.Second, 5*time.Millisecond, "the duplicate is neither done nor in the dead letters")
	if done.Message != nil {
		require.Equal(t, queue.Ack, done.Decision, "%+v", done)
		require.True(t, done.Answer.Replayed, "the original's answer")
		t.Logf("%s: requeued %d times, then done", limit, naks.Load())
	} else {
		require.NotEqual(t, noLimit, limit, "dead-lettered by the broker where no limit applies")
		conn, err := amqp.Dial(broker)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		dl, ok, err := ch.Get(topo.DeadLetterQueue, true)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "delivery_limit", dl.Headers["x-first-death-reason"])
		require.Equal(t, "duplicate", dl.Headers[requestHeader])
		t.Logf("%s: requeued %d times, then moved to the dead letters by the broker", limit, naks.Load())
	}
	var orders int
	require.NoError(t, sqlDB.QueryRow(`SELECT COUNT(*) FROM purchase_order WHERE idempotency_key = ?`, "past-the-limit").Scan(&orders))
	require.Equal(t, 1, orders)
}

// noLimit says that no delivery limit applies to the queue.
const noLimit = "no delivery limit"

// deliveryLimit makes queue name subject to a quorum queue's delivery
// limit of 20, as RabbitMQ 4 has by default: on RabbitMQ 3, which has
// none, by a policy (rabbitmqctl, on a local broker only). It says which
// limit applies.
func deliveryLimit(t *testing.T, broker, name string) string {
	t.Helper()
	conn, err := amqp.Dial(broker)
	require.NoError(t, err)
	version, _ := conn.Properties["version"].(string)
	conn.Close()
	if major, _ := strconv.Atoi(strings.Split(version, ".")[0]); major >= 4 {
		return "RabbitMQ " + version + ", its default limit"
	}
	uri, err := amqp.ParseURI(broker)
	require.NoError(t, err)
	if uri.Host != "127.0.0.1" && uri.Host != "localhost" {
		t.Logf("RabbitMQ %s on %s: no limit set, the limit not exercised", version, uri.Host)
		return noLimit
	}
	policy := brokertest.Name("delivery_limit")
	vhost := "/"
	if uri.Vhost != "" {
		vhost = uri.Vhost
	}
	out, err := exec.Command("rabbitmqctl", "set_policy", "-p", vhost, "--apply-to", "queues", policy,
		"^"+regexp.QuoteMeta(name)+"$", `{"delivery-limit":`+strconv.Itoa(quorumLimit)+`}`).CombinedOutput()
	if err != nil {
		t.Logf("RabbitMQ %s: no policy set (%v: %s), the limit not exercised", version, err, out)
		return noLimit
	}
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "clear_policy", "-p", vhost, policy).Run() })
	return "RabbitMQ " + version + ", a policy's limit as RabbitMQ 4's default"
}

// queueDepth returns how many messages wait in name, ready.
func queueDepth(t *testing.T, broker, name string) func() int {
	t.Helper()
	conn, err := amqp.Dial(broker)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return func() int {
		ch, err := conn.Channel()
		if err != nil {
			return 0
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return 0
		}
		return q.Messages
	}
}
