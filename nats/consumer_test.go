package idemnats_test

import (
	"context"
	"database/sql"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/internal/testdb"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// testBundle is a stream of this test's own with a durable consumer, a
// dead-letter stream of its own beside it, and a Consumer of it over a
// fresh MariaDB database whose handler answers what status says (201
// unless set), counting its runs.
type testBundle struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	stream     string
	subject    string
	deadStream string
	dead       string
	cfg        idemnats.Config
	cons       jetstream.Consumer
	status     atomic.Int32
	runs       atomic.Int32
	settled    chan queue.Settlement
	ended      chan struct{} // closed as the test ends: nobody reads settled
	end        func()
	consumer   *idemnats.Consumer
	running    *running
}

// setup builds the bundle and runs its Consumer until the test ends; edit
// changes the Consumer's configuration.
func setup(t *testing.T, edit func(*idemnats.Config)) *testBundle {
	t.Helper()
	b := newBundle(t, edit)
	b.create(t, nil)
	b.start(t)
	return b
}

// newBundle builds the bundle but neither its stream nor its Consumer:
// create and start do.
func newBundle(t *testing.T, edit func(*idemnats.Config)) *testBundle {
	t.Helper()
	url := brokertest.NATS(t)
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), nil)
	require.NoError(t, err)
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	b := &testBundle{nc: nc, js: js, stream: brokertest.Name("IDEMNATS"), settled: make(chan queue.Settlement, 16),
		ended: make(chan struct{})}
	b.end = sync.OnceFunc(func() { close(b.ended) })
	b.deadStream = b.stream + "_DEAD"
	b.subject, b.dead = "test."+b.stream+".in", "test."+b.stream+".dead"
	_, err = js.CreateStream(context.Background(), jetstream.StreamConfig{Name: b.deadStream, Subjects: []string{b.dead}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), b.stream)
		_ = js.DeleteStream(context.Background(), b.deadStream)
	})
	b.cfg = idemnats.Config{
		Config: queue.Config{
			Middleware: mw, Route: "POST /orders",
			Backoff: queue.Backoff{Initial: 50 * time.Millisecond, Max: 50 * time.Millisecond}, MaxDeliveries: 3,
			Handler: func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
				b.runs.Add(1)
				status := int(b.status.Load())
				if status == 0 {
					status = http.StatusCreated
				}
				return idempotency.Result{Status: status, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
			},
			Observe: func(s queue.Settlement) {
				select {
				case b.settled <- s:
				case <-b.ended:
				}
			},
		},
		DeadLetterSubject: b.dead,
	}
	if edit != nil {
		edit(&b.cfg)
	}
	return b
}

// create creates the stream, its durable consumer (editCons changes its
// configuration) and a Consumer of it.
func (b *testBundle) create(t *testing.T, editCons func(*jetstream.ConsumerConfig)) {
	t.Helper()
	ctx := context.Background()
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subject}})
	require.NoError(t, err)
	cc := jetstream.ConsumerConfig{
		Durable: "test", FilterSubject: b.subject, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	}
	if editCons != nil {
		editCons(&cc)
	}
	b.cons, err = b.js.CreateOrUpdateConsumer(ctx, b.stream, cc)
	require.NoError(t, err)
	b.consumer, err = idemnats.New(b.js, b.cons, b.cfg)
	require.NoError(t, err)
}

// running is one Run of the bundle's Consumer.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// wait returns what Run returned, once it did.
func (r *running) wait() error {
	r.once.Do(func() { r.err = <-r.done })
	return r.err
}

// start runs the Consumer until stop, or the test's end.
func (b *testBundle) start(t *testing.T) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	c := b.consumer
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		b.end()
		require.NoError(t, r.wait())
	})
	b.running = r
	return r
}

// stop ends the Consumer's Run and waits for it to return.
func (b *testBundle) stop(t *testing.T) {
	t.Helper()
	b.running.cancel()
	require.NoError(t, b.running.wait())
}

// deadLetters returns the dead letters stored, oldest first.
func (b *testBundle) deadLetters(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	stream, err := b.js.Stream(ctx, b.deadStream)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

func (b *testBundle) publish(t *testing.T, h nats.Header, body string) uint64 {
	t.Helper()
	m := nats.NewMsg(b.subject)
	m.Header, m.Data = h, []byte(body)
	ack, err := b.js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	return ack.Sequence
}

func (b *testBundle) next(t *testing.T) queue.Settlement {
	t.Helper()
	select {
	case s := <-b.settled:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("no message settled within 30s")
	}
	return queue.Settlement{}
}

// ackedUpTo waits until the consumer's ack floor reaches seq: the message
// is settled on the server (acked or terminated), never delivered again.
func (b *testBundle) ackedUpTo(t *testing.T, seq uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := b.cons.Info(context.Background())
		return err == nil && info.AckFloor.Stream >= seq && info.NumAckPending == 0
	}, 30*time.Second, 10*time.Millisecond, "the server never saw message %d settled", seq)
}

func TestADeadLetter_IsStoredWithTheReason_ThenTheMessageTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	seq := b.publish(t, nats.Header{"Idempotency-Key": {"two words"}}, `{"a":1}`)
	s := b.next(t)
	require.Equal(t, queue.DeadLetter, s.Decision, "%+v", s)
	b.ackedUpTo(t, seq)
	dls := b.deadLetters(t)
	require.Len(t, dls, 1, "the dead letter is in the dead-letter stream")
	dl := dls[0]
	require.Equal(t, `{"a":1}`, string(dl.Data))
	require.Equal(t, idempotency.ProblemInvalidKey, dl.Header.Get(queue.ReasonHeader))
	require.Equal(t, "400", dl.Header.Get(queue.DeadStatusHeader))
	require.Equal(t, b.subject, dl.Header.Get(queue.SourceHeader))
	require.Equal(t, "two words", dl.Header.Get("Idempotency-Key"), "the message's own headers are kept")
	require.Contains(t, dl.Header.Get(nats.MsgIdHdr), "dead-letter:"+b.stream+":", "an id of its own")
}

func TestANakedMessage_IsDeliveredAgain_ItsDeliveryCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.status.Store(http.StatusInternalServerError)
	seq := b.publish(t, nats.Header{"Nats-Msg-Id": {"m1"}}, `{"a":1}`)
	first := b.next(t)
	require.Equal(t, queue.Nak, first.Decision)
	require.Equal(t, 1, first.Message.Delivery)
	b.status.Store(http.StatusCreated)
	second := b.next(t)
	require.Equal(t, queue.Ack, second.Decision, "%+v", second)
	require.Equal(t, 2, second.Message.Delivery, "JetStream counts the deliveries")
	require.Equal(t, "m1", second.Message.ID, "Nats-Msg-Id is the message id, and the key")
	b.ackedUpTo(t, seq)
	require.EqualValues(t, 2, b.runs.Load())
}

func TestAMessageThatAsksForAReply_GetsTheAnswerOnItsReplyToSubject(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	inbox := nats.NewInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	require.NoError(t, err)
	h := nats.Header{"Idempotency-Key": {"k1"}, idemnats.ReplyToHeader: {inbox}}
	for i := range 2 {
		b.publish(t, h, `{"a":1}`)
		reply, err := sub.NextMsg(30 * time.Second)
		require.NoError(t, err)
		require.Equal(t, "201", reply.Header.Get(queue.StatusHeader))
		require.Equal(t, "application/json", reply.Header.Get("Content-Type"))
		require.Equal(t, `{"ok":true}`, string(reply.Data))
		if i == 1 {
			require.Equal(t, "true", reply.Header.Get(queue.ReplayedHeader), "the second is the record's")
		}
	}
	require.EqualValues(t, 1, b.runs.Load())
}

func TestNew_RefusesAConsumerThatDoesNotAckExplicitly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cons, err := b.js.CreateOrUpdateConsumer(context.Background(), b.stream, jetstream.ConsumerConfig{
		Durable: "acks-none", AckPolicy: jetstream.AckNonePolicy,
	})
	require.NoError(t, err)
	_, err = idemnats.New(b.js, cons, idemnats.Config{Config: queue.Config{Unprotected: &sql.DB{},
		Handler: func(context.Context, *sql.Tx, *queue.Message) idempotency.Result { return idempotency.Result{} }}})
	require.ErrorContains(t, err, "explicit acks")
}
