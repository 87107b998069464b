package idemamqp_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	idemamqp "github.com/orderguard/idempotency/amqp"
	"github.com/orderguard/idempotency/queue"
)

// A dead letter that no queue takes (its queue was deleted after the
// session declared it) is returned by the broker: the message is not
// acked but delivered again, until the dead-letter queue is back.
func TestADeadLetterThatNoQueueTakes_LeavesTheMessageInItsQueue(t *testing.T) {
	t.Parallel()
	for _, qt := range []idemamqp.QueueType{idemamqp.ClassicQueue, idemamqp.QuorumQueue} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			b := setup(t, amqp.Table{"x-queue-type": string(qt)}, nil)
			b.publish(t, amqp.Publishing{MessageId: "ready", Body: []byte(`{"a":0}`)})
			require.Equal(t, queue.Ack, b.next(t).Decision, "the session runs: it declared the dead-letter queue")
			_, err := b.ch.QueueDelete(b.dead, false, false, false)
			require.NoError(t, err)

			poison := amqp.Publishing{MessageId: "m1", Headers: amqp.Table{"Idempotency-Key": "two words"}, Body: []byte(`{"a":1}`)}
			b.publish(t, poison)
			for range 2 { // the first delivery and its redelivery: requeued, not lost
				s := b.next(t)
				require.Equal(t, queue.Nak, s.Decision, "%+v", s)
				require.ErrorContains(t, s.Err, "does not exist")
				require.Equal(t, "m1", s.Message.ID)
			}

			_, err = b.ch.QueueDeclare(b.dead, true, false, false, false, nil)
			require.NoError(t, err)
			for s := b.next(t); s.Decision != queue.DeadLetter; s = b.next(t) {
				require.Equal(t, queue.Nak, s.Decision, "%+v", s)
			}
			dl, ok, err := b.ch.Get(b.dead, true)
			require.NoError(t, err)
			require.True(t, ok, "dead-lettered once its queue is back")
			require.Equal(t, "m1", dl.MessageId)
		})
	}
}

// A reply that no queue takes (reply_to names a queue that is gone: the
// client went away) can never be delivered: the message, its order
// committed, is acked once and not delivered again.
func TestAReplyThatNoQueueTakes_IsUndeliverable_TheMessageAckedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, amqp.Table{"x-queue-type": "quorum"}, nil)
	b.publish(t, amqp.Publishing{MessageId: "m1", ReplyTo: b.queue + ".gone", Body: []byte(`{"a":1}`)})
	s := b.next(t)
	require.Equal(t, queue.Ack, s.Decision, "%+v", s)
	require.NoError(t, s.Err)
	require.ErrorIs(t, s.ReplyErr, queue.ErrUndeliverable, "the lost reply is reported")
	require.EqualValues(t, 1, b.runs.Load())
}
