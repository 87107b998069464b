package idemnats_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/queue"
)

// An empty Idempotency-Key header is no key, as over HTTP: the message's
// Nats-Msg-Id is its key, and the same key sent in the header later is
// the same action, replayed.
func TestAnEmptyKeyHeader_IsNoKey_TheMessageIDIsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	seq := b.publish(t, nats.Header{"Idempotency-Key": {""}, nats.MsgIdHdr: {"m-empty"}}, `{"a":1}`)
	s := b.next(t)
	require.Equal(t, queue.Ack, s.Decision, "%+v", s)
	require.False(t, s.Answer.Replayed)
	b.ackedUpTo(t, seq)

	seq = b.publish(t, nats.Header{"Idempotency-Key": {"m-empty"}}, `{"a":1}`)
	s = b.next(t)
	require.Equal(t, queue.Ack, s.Decision, "%+v", s)
	require.True(t, s.Answer.Replayed, "the message id was the key")
	b.ackedUpTo(t, seq)
	require.EqualValues(t, 1, b.runs.Load())
}
