package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/queue"
)

// Workers publish on one channel at once; the broker's returns carry no
// delivery tag. Each publish learns whether it was its own message that
// was returned, never another's.
func TestPublish_SeveralAtOnce_EachLearnsWhetherItsOwnWasReturned(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(brokertest.AMQP(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	there := brokertest.Name("idemamqp_there")
	_, err = ch.QueueDeclare(there, false, true, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(there, false, false, false) })
	pubCh, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, pubCh.Confirm(false))
	p := newPublisher(pubCh)

	const workers, each = 8, 40
	var wg sync.WaitGroup
	verdicts := make(chan string, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key, want := there, "taken"
				if (w+i)%2 == 0 {
					key, want = there+"_gone", "returned"
				}
				err := p.publish(context.Background(), key, true, amqp.Publishing{Body: []byte(key)})
				var returned *errReturned
				got := "taken"
				switch {
				case errors.As(err, &returned) && returned.key == key:
					got = "returned"
				case err != nil:
					got = err.Error()
				}
				if got != want {
					verdicts <- fmt.Sprintf("worker %d publish %d to %s: %s, want %s", w, i, key, got, want)
				}
			}
		})
	}
	wg.Wait()
	close(verdicts)
	var wrong []string
	for v := range verdicts {
		wrong = append(wrong, v)
	}
	require.Empty(t, wrong)
	q, err := ch.QueueDeclarePassive(there, false, true, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, workers*each/2, q.Messages, "every message not returned is in its queue")
}

// A reply that no queue takes can never be delivered: its error wraps
// queue.ErrUndeliverable, so that the processor acks the message, done.
// A channel that closed may be open again at the next delivery: not
// undeliverable.
func TestReply_ToAQueueThatIsGone_IsUndeliverable(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(brokertest.AMQP(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	there := brokertest.Name("idemamqp_reply")
	_, err = ch.QueueDeclare(there, false, true, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(there, false, false, false) })
	reply := func(replyTo string, closed bool) error {
		pubCh, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, pubCh.Confirm(false))
		d := &delivery{s: &session{pub: newPublisher(pubCh)}, m: &queue.Message{ReplyTo: replyTo, CorrelationID: "c1"}}
		if closed {
			require.NoError(t, pubCh.Close())
		}
		return d.Reply(context.Background(), queue.Reply{Status: 201, Body: []byte(`{}`)})
	}

	err = reply(there+"_gone", false)
	require.ErrorIs(t, err, queue.ErrUndeliverable)
	require.ErrorContains(t, err, "does not exist")
	require.NoError(t, reply(there, false))
	err = reply(there, true)
	require.Error(t, err)
	require.NotErrorIs(t, err, queue.ErrUndeliverable)
}
