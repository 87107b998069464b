package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

const order = `{"sku_id":20001,"quantity":1}`

func TestAMessage_IsAckedOnlyAfterItsRunCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	d := msg("k1", order, 1)
	d.onAck = func() {
		// Read from another connection: what is acked has committed.
		require.Equal(t, 1, b.effects(t, "k1"), "the effect committed before the ack")
		var status string
		require.NoError(t, b.db.QueryRow(`SELECT status FROM idempotency_record WHERE idempotency_key = 'k1'`).Scan(&status))
		require.Equal(t, "DONE", status, "the record committed before the ack")
	}
	b.process(d)
	require.Equal(t, []string{"ack"}, d.settled())
}

func TestARedeliveredMessageWhoseRecordIsFinal_IsAckedWithoutRunning_ItsReplyPublishedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{ReplayCacheBytes: -1}, nil) // from the record, not the cache
	first := msg("k1", order, 1)
	first.m.ReplyTo = "inbox.1"
	b.process(first)
	again := first.redeliver()
	b.process(again)
	require.Equal(t, []string{"ack"}, again.settled())
	require.Equal(t, 1, b.runCount("k1"), "a redelivery does not run")
	require.Len(t, again.replies, 1, "the message asked for a reply: it gets the record's")
	r := again.replies[0]
	require.True(t, r.Replayed)
	require.Equal(t, first.replies[0].Status, r.Status)
	require.Equal(t, first.replies[0].Body, r.Body)
	require.Equal(t, []string{"/orders/k1"}, r.Header["Location"])

	silent := msg("k1", order, 3) // no ReplyTo: no reply
	b.process(silent)
	require.Equal(t, []string{"ack"}, silent.settled())
	require.Empty(t, silent.replies)
}

func TestAKeyAnotherConsumerHolds_IsNakedWithTheRetryDelay_NeverAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	store := idempotency.NewMySQLStore(b.db)
	fp := fingerprintOf(t, b, "k1", order)
	_, err := store.Claim(context.Background(), idempotency.Claim{Scope: "7", Key: "k1", Fingerprint: fp,
		Owner: "other-consumer/1", Lease: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	for delivery := 1; delivery <= 5; delivery++ { // past MaxDeliveries: never dead-lettered either
		d := b.process(msg("k1", order, delivery))[0]
		require.Equal(t, []string{"nak 250ms"}, d.settled(), "delivery %d", delivery)
	}
	require.Zero(t, b.runCount("k1"))
}

func TestTheSameKeyWithAnotherPayload_IsDeadLetteredWithTheReason_NeverRun(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	b.process(msg("k1", order, 1))
	changed := msg("k1", `{"sku_id":20001,"quantity":3}`, 1)
	changed.m.ID, changed.m.ReplyTo = "msg-2", "inbox.2"
	b.process(changed)
	require.Equal(t, []string{"dead-letter key-reused"}, changed.settled())
	h := changed.dead[0]
	require.Equal(t, "409", h[queue.DeadStatusHeader])
	require.Contains(t, h[queue.DetailHeader], "Idempotency key reused")
	require.Equal(t, "1", h[queue.DeliveriesHeader])
	require.Equal(t, "orders.create", h[queue.SourceHeader])
	require.Equal(t, "msg-2", h[queue.MessageIDHeader])
	require.Len(t, changed.replies, 1, "its publisher hears why")
	require.Equal(t, http.StatusConflict, changed.replies[0].Status)
	require.Contains(t, string(changed.replies[0].Body), idempotency.ProblemKeyReused)
	require.Equal(t, 1, b.runCount("k1"), "the changed payload never ran")
}

func TestAFailingHandler_IsNakedWithBackoff_ThenDeadLetteredAtMaxDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	b.answer("k1", http.StatusInternalServerError)
	d1 := b.process(msg("k1", order, 1))[0]
	d2 := b.process(d1.redeliver())[0]
	d3 := b.process(d2.redeliver())[0] // MaxDeliveries is 3
	require.Equal(t, []string{"nak 1s"}, d1.settled())
	require.Equal(t, []string{"nak 2s"}, d2.settled(), "the delay doubles")
	require.Equal(t, []string{"dead-letter " + queue.ReasonMaxDeliveries}, d3.settled())
	require.Equal(t, "500", d3.dead[0][queue.DeadStatusHeader])
	require.Equal(t, "3", d3.dead[0][queue.DeliveriesHeader])
	require.Equal(t, 3, b.runCount("k1"), "a failure releases the key: each delivery ran")
	require.Zero(t, b.effects(t, "k1"), "every failed run rolled back")
}

func TestAFinalRejection_IsRecordedAndAcked_ItsRedeliveryReplaysIt(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	b.answer("k1", http.StatusUnprocessableEntity)
	d := b.process(msg("k1", order, 1))[0]
	require.Equal(t, []string{"ack"}, d.settled())
	again := b.process(d.redeliver())[0]
	require.Equal(t, []string{"ack"}, again.settled())
	require.Equal(t, 1, b.runCount("k1"), "the refusal is the record's answer")
	require.Zero(t, b.effects(t, "k1"))
}

func TestAFaultOfTheInfrastructure_IsNakedWithTheRetryDelay_NeverDeadLettered(t *testing.T) {
	t.Parallel()
	db, err := sqlOpenUnreachable(t)
	require.NoError(t, err)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), nil)
	require.NoError(t, err)
	b := build(t, db, mw, nil)
	for delivery := 1; delivery <= 4; delivery++ {
		d := b.process(msg("k1", order, delivery))[0]
		require.Equal(t, []string{"nak 250ms"}, d.settled(), "delivery %d", delivery)
	}
	require.Zero(t, b.runCount("k1"), "nothing ran")
}

// A handler that met a fault of the database answers 503 (as the example
// service does): that is no failure of the handler's, and never
// dead-letters a message.
func TestAHandlersServiceUnavailable_IsNakedWithTheRetryDelay_NeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	b.answer("k1", http.StatusServiceUnavailable)
	d := b.process(msg("k1", order, 3))[0]
	require.Equal(t, []string{"nak 250ms"}, d.settled())
}

func TestBadInput_IsDeadLetteredWithItsProblem_NothingWritten(t *testing.T) {
	t.Parallel()
	tooLong := strings.Repeat("k", 256)
	b := setup(t, idempotency.Config{MaxBodyBytes: 1 << 10}, func(c *queue.Config) {
		c.Validate = func(m *queue.Message) error {
			switch string(m.Body) {
			case `"forbidden"`:
				return idempotency.NewProblem(http.StatusForbidden, "forbidden", "Forbidden", "not yours")
			case `"plain error"`:
				return errors.New("does not decode")
			}
			return nil
		}
	})
	noUser := msg("k5", order, 1)
	delete(noUser.m.Header, "X-User-ID")
	twoKeys := msg("k6", order, 1)
	twoKeys.m.Header["idempotency-key"] = []string{"k7"}
	for _, tc := range []struct {
		name   string
		d      *fakeDelivery
		reason string
	}{
		{"no key and no message id", msg("", order, 1), idempotency.ProblemMissingKey},
		{"a key of spaces", msg("two words", order, 1), idempotency.ProblemInvalidKey},
		{"a message id too long", func() *fakeDelivery { d := msg("", order, 1); d.m.ID = tooLong; return d }(), idempotency.ProblemInvalidKey},
		{"two key headers", twoKeys, idempotency.ProblemInvalidKey},
		{"a payload that is not JSON", msg("k2", `{"sku_id":`, 1), idempotency.ProblemInvalidBody},
		{"a payload over MaxBodyBytes", msg("k3", `{"note":"`+strings.Repeat("x", 2<<10)+`"}`, 1), idempotency.ProblemBodyTooLarge},
		{"a refusal of Validate", msg("k4", `"forbidden"`, 1), "forbidden"},
		{"another error of Validate", msg("k8", `"plain error"`, 1), idempotency.ProblemInvalidBody},
		{"no scope (the scope header is empty)", noUser, idempotency.ProblemScopeRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.process(tc.d)
			require.Equal(t, []string{"dead-letter " + tc.reason}, tc.d.settled())
		})
	}
	var records int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM idempotency_record`).Scan(&records))
	require.Zero(t, records, "bad input writes nothing")
}

func TestTheKey_IsTheKeyHeader_ElseTheMessageID_OrWhatKeySays(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	byID := msg("", order, 1)
	byID.m.ID = "msg-1"
	b.process(byID)
	require.Equal(t, 1, b.runCount("msg-1"), "without the header the message id is the key")
	both := msg("header-key", order, 1)
	both.m.ID = "msg-2"
	b.process(both)
	require.Equal(t, 1, b.runCount("header-key"), "the header wins over the id")
	require.Zero(t, b.runCount("msg-2"))

	custom := setup(t, idempotency.Config{}, func(c *queue.Config) {
		c.Key = func(m *queue.Message) (string, error) { return "order-" + m.ID, nil }
	})
	d := msg("ignored", order, 1)
	d.m.ID = "42"
	custom.process(d)
	require.Equal(t, 1, custom.runCount("order-42"))
}

func TestTheScope_OwnsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	seven := msg("shared", order, 1)
	eight := msg("shared", order, 1)
	eight.m.Header["X-User-ID"] = []string{"8"}
	b.process(seven)
	b.process(eight)
	require.Equal(t, []string{"ack"}, eight.settled())
	require.Equal(t, 2, b.runCount("shared"), "one key, two scopes: two actions")
}

// A reply or a dead letter the broker did not take leaves the message to
// be delivered again: its record replies next time.
func TestAReplyOrDeadLetterNotPublished_IsNaked(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	d := msg("k1", order, 1)
	d.m.ReplyTo, d.replyErr = "inbox", errors.New("connection lost")
	b.process(d)
	require.Equal(t, []string{"nak 250ms"}, d.settled())
	require.Equal(t, 1, b.effects(t, "k1"), "the run committed; the next delivery replays it")

	conflict := msg("k1", `{"sku_id":1}`, 1)
	conflict.deadErr = errors.New("stream unavailable")
	b.process(conflict)
	require.Equal(t, []string{"nak 250ms"}, conflict.settled())
}

// A message whose key was used over HTTP for the same route, scope and
// business fields is the same action: replayed, never run; with other
// fields it is a conflict.
func TestAKeyUsedOverHTTP_IsOneActionInAMessage(t *testing.T) {
	t.Parallel()
	fields := idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}}
	b := setup(t, idempotency.Config{Fingerprint: fields,
		ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }},
		func(c *queue.Config) { c.Fingerprint = fields })
	h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"over":"http"}`))
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{"quantity":1,"sku_id":20001,"note":"ignored"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "7")
	req.Header.Set("Idempotency-Key", "http-key")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code)

	same := msg("http-key", order, 1)
	same.m.ReplyTo = "inbox"
	b.process(same)
	require.Equal(t, []string{"ack"}, same.settled())
	require.Zero(t, b.runCount("http-key"))
	require.True(t, same.replies[0].Replayed)
	require.Equal(t, `{"over":"http"}`, string(same.replies[0].Body))

	other := msg("http-key", `{"sku_id":20001,"quantity":2}`, 1)
	b.process(other)
	require.Equal(t, []string{"dead-letter key-reused"}, other.settled())
}

// fingerprintOf is the fingerprint the bundle's processor gives a message
// of key and body: the HTTP route's over the same JSON.
func fingerprintOf(t *testing.T, b *testBundle, key, body string) string {
	t.Helper()
	fp, err := idempotency.NewJSONFingerprint(b.cfg.Fingerprint)("POST", "/orders", []byte(body))
	require.NoError(t, err)
	return fp
}

// With KeyReusedFunc, a reused key's message is the function's: its answer
// settles the message (a 2xx acks it, and is its reply), in a batch too;
// its error is a fault to retry, never a dead letter. The changed payload
// never runs either way.
func TestTheSameKeyWithAnotherPayload_WithKeyReusedFunc_IsSettledByItsAnswer(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var taken []string
	fail := errors.New("the database is down")
	failing := true
	b := setup(t, idempotency.Config{}, func(c *queue.Config) {
		c.KeyReusedFunc = func(ctx context.Context, m *queue.Message, refused idempotency.Answer) (idempotency.Answer, error) {
			require.Equal(t, idempotency.ProblemKeyReused, refused.Problem.Kind())
			mu.Lock()
			defer mu.Unlock()
			if failing {
				failing = false
				return idempotency.Answer{}, fail
			}
			taken = append(taken, m.ID)
			return idempotency.Answer{Status: http.StatusOK, Header: map[string][]string{"Content-Type": {"application/json"}},
				Body: []byte(`{"anomaly":"payload-mismatch"}`)}, nil
		}
	})
	b.process(msg("k1", order, 1))
	changed := msg("k1", `{"sku_id":20001,"quantity":3}`, 1)
	changed.m.ID, changed.m.ReplyTo = "msg-2", "inbox.2"
	b.process(changed)
	require.Equal(t, []string{"nak 250ms"}, changed.settled(), "its fault is the infrastructure's: delivered again")
	require.Empty(t, changed.replies, "no reply before the message is done")

	again := changed.redeliver()
	b.process(again, msg("k2", order, 1)) // in a batch, beside a message that runs
	require.Equal(t, []string{"ack"}, again.settled())
	require.Len(t, again.replies, 1)
	require.Equal(t, http.StatusOK, again.replies[0].Status)
	require.JSONEq(t, `{"anomaly":"payload-mismatch"}`, string(again.replies[0].Body))
	require.Equal(t, []string{"msg-2"}, taken)
	require.Equal(t, 1, b.runCount("k1"), "the changed payload never ran")
	require.Equal(t, 1, b.effects(t, "k1"))
	require.Equal(t, 1, b.runCount("k2"))
}

// Once its context has ended, Run begins nothing more, even with
// deliveries waiting in its channel: those are the front-end's to hand
// back, at once, rather than begun by a worker that happened to be free.
func TestAfterShutdown_RunTakesNothingMore_TheDeliveriesWaitingAreLeft(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, func(c *queue.Config) { c.Workers = 4 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for round := range 50 { // a select among ready cases picks at random
		in := make(chan queue.Delivery, 8)
		for i := range cap(in) {
			in <- msg(fmt.Sprintf("k%d-%d", round, i), order, 1)
		}
		b.p.Run(ctx, in)
		require.Len(t, in, cap(in), "round %d: every delivery left waiting", round)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.runs, "nothing ran")
}
