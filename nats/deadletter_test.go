package idemnats_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

// A message published with JetStream's publish guards (Nats-Expected-*,
// Nats-TTL, …) carries instructions to its own stream, not business
// data: its dead letter keeps its headers but none of the server's, or
// the dead-letter stream would refuse it (err_code 10060: expected stream
// does not match) and the message be naked for ever.
func TestADeadLetter_KeepsTheMessagesHeaders_ButNoneOfTheServers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	m := nats.NewMsg(b.subject)
	m.Header = nats.Header{
		"Idempotency-Key": {"two words"}, // poison: an invalid key
		"X-Trace-Id":      {"trace-1"},
		"Nats-TTL":        {"1h"},
		// Spelled in another case: the server ignores it, the dead letter drops it.
		"NATS-EXPECTED-LAST-MSG-ID": {"none"},
	}
	m.Data = []byte(`{"a":1}`)
	ack, err := b.js.PublishMsg(context.Background(), m, jetstream.WithMsgID("m1"),
		jetstream.WithExpectStream(b.stream), jetstream.WithExpectLastSequence(0))
	require.NoError(t, err)

	s := b.next(t)
	require.Equal(t, queue.DeadLetter, s.Decision, "%+v", s)
	require.NoError(t, s.Err, "the dead-letter stream took it")
	b.ackedUpTo(t, ack.Sequence)
	dls := b.deadLetters(t)
	require.Len(t, dls, 1)
	dl := dls[0]
	require.Equal(t, idempotency.ProblemInvalidKey, dl.Header.Get(queue.ReasonHeader))
	require.Equal(t, "trace-1", dl.Header.Get("X-Trace-Id"), "the business headers are kept")
	require.Equal(t, "two words", dl.Header.Get("Idempotency-Key"))
	require.Equal(t, "m1", dl.Header.Get(queue.MessageIDHeader), "the message id is kept as the dead letter's")
	for k, vs := range dl.Header {
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			require.Equal(t, nats.MsgIdHdr, k, "no server header but the dead letter's own id")
			require.True(t, strings.HasPrefix(vs[0], "dead-letter:"), "the dead letter's own id, not the message's: %q", vs[0])
		}
	}
}

// A stream deleted and created again numbers its messages from 1 again:
// the dead letter of its message at sequence N is not a duplicate of the
// old stream's at N, within the dead-letter stream's Duplicates window.
func TestADeadLetter_OfAStreamCreatedAgain_IsStoredBesideTheOldStreamsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.publish(t, nats.Header{"Idempotency-Key": {"two words"}}, `{"stream":"old"}`)
	require.Equal(t, queue.DeadLetter, b.next(t).Decision)
	b.ackedUpTo(t, first)

	b.stop(t)
	require.NoError(t, b.js.DeleteStream(context.Background(), b.stream))
	b.create(t, nil)
	b.start(t)
	again := b.publish(t, nats.Header{"Idempotency-Key": {"two words"}}, `{"stream":"new"}`)
	require.Equal(t, first, again, "the same sequence in the new stream")
	s := b.next(t)
	require.Equal(t, queue.DeadLetter, s.Decision)
	b.ackedUpTo(t, again)

	dls := b.deadLetters(t)
	require.Len(t, dls, 2, "both dead letters are stored")
	require.Equal(t, `{"stream":"old"}`, string(dls[0].Data))
	require.Equal(t, `{"stream":"new"}`, string(dls[1].Data))
	require.NotEqual(t, dls[0].Header.Get(nats.MsgIdHdr), dls[1].Header.Get(nats.MsgIdHdr))
}
