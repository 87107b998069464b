package idemnats

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/queue"
)

// A message dead-lettered again, after its Term was lost and it was
// delivered once more, gets the dead letter's id it got the first time:
// the dead-letter stream stores it once.
func TestADeadLetterAgain_OfTheSameMessage_IsStoredOnce(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(brokertest.NATS(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	name := brokertest.Name("IDEMNATS")
	subject, dead := "test."+name+".in", "test."+name+".dead"
	for stream, subj := range map[string]string{name: subject, name + "_DEAD": dead} {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "test", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	})
	require.NoError(t, err)
	c, err := New(js, cons, Config{DeadLetterSubject: dead, Config: queue.Config{Unprotected: &sql.DB{},
		Handler: func(context.Context, *sql.Tx, *queue.Message) idempotency.Result { return idempotency.Result{} }}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, subject, []byte(`{"a":1}`))
	require.NoError(t, err)

	// Two deliveries of one message, as a lost Term leaves it to be
	// delivered again: the first naked behind the client's back, so that
	// its own Term is still sent.
	var ds []*delivery
	for range 2 {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		require.NoError(t, err)
		msg := <-batch.Messages()
		require.NotNil(t, msg)
		ds = append(ds, c.delivery(msg))
		if len(ds) == 1 {
			require.NoError(t, nc.Publish(msg.Reply(), []byte("-NAK")))
		}
	}
	require.Equal(t, 2, ds[1].Message().Delivery)
	for _, d := range ds {
		require.NoError(t, d.DeadLetter(ctx, map[string]string{queue.ReasonHeader: "test"}))
	}
	stream, err := js.Stream(ctx, name+"_DEAD")
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "stored once")
}
