package queue_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

// A reply the broker refuses for good (queue.ErrUndeliverable) never
// blocks the settlement: no delivery could ever publish it, and a message
// naked for it would replay for ever. The message is settled as decided
// and the lost reply reported in Settlement.ReplyErr; a reply that failed
// for a moment still has the message delivered again.
func TestAReplyLostForGood_IsReported_TheMessageSettledAsDecided(t *testing.T) {
	t.Parallel()
	var last queue.Settlement
	b := setup(t, idempotency.Config{}, func(c *queue.Config) { c.Observe = func(s queue.Settlement) { last = s } })
	lost := fmt.Errorf("reply subject %q: %w", "in box", queue.ErrUndeliverable)
	for _, tc := range []struct {
		name     string
		key      string
		replyErr error
		want     string
		lost     bool
	}{
		{"a committed order: acked", "k1", lost, "ack", true},
		{"its redelivery, replayed: acked", "k1", lost, "ack", true},
		{"a poison message: dead-lettered", "two words", lost, "dead-letter " + idempotency.ProblemInvalidKey, true},
		{"a reply that failed for a moment: naked", "k2", errors.New("connection lost"), "nak 250ms", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := msg(tc.key, order, 1)
			d.m.ReplyTo, d.replyErr = "in box", tc.replyErr
			b.process(d)
			require.Equal(t, []string{tc.want}, d.settled())
			if tc.lost {
				require.ErrorIs(t, last.ReplyErr, queue.ErrUndeliverable)
				require.NoError(t, last.Err, "the message was settled as decided")
			} else {
				require.NoError(t, last.ReplyErr)
				require.ErrorIs(t, last.Err, tc.replyErr)
			}
		})
	}
	require.Equal(t, 1, b.runCount("k1"), "the committed order ran once")
}
