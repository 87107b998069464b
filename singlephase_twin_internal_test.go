package idempotency

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
)

// twinBed is a single-phase route on MariaDB whose handler writes a ledger
// row, and whose first execution holds until released.
type twinBed struct {
	mw         *Middleware
	srv        *httptest.Server
	executions atomic.Int64
	entered    chan struct{}
	release    chan struct{}
}

// With InFlightWait, a duplicate that arrives while this instance executes
// its key waits for that execution and replays its answer: the handler runs once, where the
// duplicate used to run beside it, block on the uncommitted record, roll
// back and replay. With the replay cache off it replays from the record.
func TestSinglePhase_DuplicateWhileThisInstanceExecutesTheKey_WaitsAndReplays_WithoutExecuting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cache int64
	}{{"replay cache on", 0}, {"replay cache off", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newTwinBed(t, tc.cache, http.StatusCreated)
			first, second := b.sendTwins(t, `{"amount":1}`)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, http.StatusCreated, second.status)
			require.Equal(t, "true", second.replayed, "the duplicate replays")
			require.Equal(t, first.body, second.body)
			require.EqualValues(t, 1, b.executions.Load(), "the handler ran once")
		})
	}
}

// A twin that leaves nothing (its answer is not recorded: a 5xx rolls its
// transaction back) does not answer the duplicate waiting for it: the
// duplicate executes itself.
func TestSinglePhase_DuplicateOfATwinThatLeavesNothing_Executes(t *testing.T) {
	t.Parallel()
	b := newTwinBed(t, 0, http.StatusServiceUnavailable)
	first, second := b.sendTwins(t, `{"amount":1}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "the twin's own answer")
	require.Equal(t, http.StatusCreated, second.status, "the duplicate ran: %s", second.body)
	require.Empty(t, second.replayed)
	require.EqualValues(t, 2, b.executions.Load())
}

// newTwinBed serves the route; the first execution answers firstStatus
// after it is released, later ones 201.
func newTwinBed(t *testing.T, cacheBytes int64, firstStatus int) *twinBed {
	db, _ := testdb.MySQL(t)
	ctx := context.Background()
	require.NoError(t, Migrate(ctx, db))
	_, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	mw, err := New(NewMySQLStore(db), &Config{Mode: ModeSinglePhase, ReplayCacheBytes: cacheBytes, InFlightWait: time.Minute})
	require.NoError(t, err)
	b := &twinBed{mw: mw, entered: make(chan struct{}), release: make(chan struct{})}
	b.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := TxFromContext(r.Context())
		n := b.executions.Add(1)
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		status := http.StatusCreated
		if n == 1 {
			close(b.entered)
			<-b.release
			status = firstStatus
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"execution":`+strings.Repeat("1", int(n))+`}`)
	})))
	t.Cleanup(b.srv.Close)
	return b
}

type twinAnswer struct {
	status   int
	replayed string
	body     string
}

// sendTwins sends one request, and a duplicate once the first executes;
// it releases the first once the duplicate waits for it, never before.
func (b *twinBed) sendTwins(t *testing.T, body string) (first, second twinAnswer) {
	send := func(out *twinAnswer, done chan<- struct{}) {
		defer close(done)
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/ledger", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Idempotency-Key", "twin-key")
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		*out = twinAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), body: string(got)}
	}
	firstDone, secondDone := make(chan struct{}), make(chan struct{})
	go send(&first, firstDone)
	<-b.entered
	go send(&second, secondDone)
	waited := false
	for deadline := time.Now().Add(10 * time.Second); !waited && time.Now().Before(deadline); {
		waited = b.mw.inflight.twins.Load() == 1
		time.Sleep(time.Millisecond) // polling the hook, not waiting for time to pass
	}
	close(b.release) // also when the duplicate did not wait: the first must end
	<-firstDone
	<-secondDone
	if !waited {
		t.Fatalf("the duplicate did not wait for the execution of its key on this instance; it answered %+v", second)
	}
	return first, second
}
