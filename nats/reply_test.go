package idemnats_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/brokertest"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// A Reply-To no message can be published to loses the reply for good, and
// never blocks the settlement: a committed order is acked once, not
// redelivered for ever, and a poison message dead-lettered. A valid
// subject that nobody listens on is no failure at all: over core NATS a
// reply is fire-and-forget.
func TestAReplyToNoMessageCanGoTo_LosesTheReply_NeverTheSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, tc := range []struct {
		replyTo string
		lost    bool
	}{
		{"in box", true},
		{"inbox.*", true},
		{"inbox.>", true},
		{"inbox..x", true},
		{"inbox.x.", true},
		{"inbox.nobody.listens", false},
	} {
		t.Run(tc.replyTo, func(t *testing.T) {
			runs := b.runs.Load()
			seq := b.publish(t, nats.Header{"Idempotency-Key": {brokertest.Name("k")}, idemnats.ReplyToHeader: {tc.replyTo}}, `{"a":1}`)
			s := b.next(t)
			require.Equal(t, queue.Ack, s.Decision, "%+v", s)
			require.NoError(t, s.Err)
			if tc.lost {
				require.ErrorIs(t, s.ReplyErr, queue.ErrUndeliverable)
			} else {
				require.NoError(t, s.ReplyErr)
			}
			b.ackedUpTo(t, seq)
			require.Equal(t, runs+1, b.runs.Load(), "the order ran once")

			poison := b.publish(t, nats.Header{"Idempotency-Key": {"two words"}, idemnats.ReplyToHeader: {tc.replyTo}}, `{"a":1}`)
			s = b.next(t)
			require.Equal(t, queue.DeadLetter, s.Decision, "%+v", s)
			require.NoError(t, s.Err)
			require.Equal(t, idempotency.ProblemInvalidKey, s.Reason)
			b.ackedUpTo(t, poison)
		})
	}
	require.Len(t, b.deadLetters(t), 6, "every poison message dead-lettered")
}
