package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
)

// The middleware's specifications on PostgreSQL, against a small ledger
// service: every run of its handler reads the accounts' total (which makes
// the transaction's snapshot), debits one account and appends a ledger row,
// all in the middleware's transaction.

// ledgerService is the business handler of these specs.
type ledgerService struct {
	// isolation, when set, is the transaction's level (SET TRANSACTION as
	// its first statement, as a PostgreSQL handler raises its own).
	isolation string
	// beforeWrite runs between the read and the writes, with the run's
	// number (1 for the first run of any request).
	beforeWrite func(ctx context.Context, run int32)
	// ignoreDeadline makes the handler's statements outlive its context: a
	// stale holder that goes on after its lease.
	ignoreDeadline bool

	runs atomic.Int32
}

// ledgerRequest is the body the service takes.
type ledgerRequest struct {
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
}

func (s *ledgerService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := s.runs.Add(1)
	ctx := r.Context()
	if s.ignoreDeadline {
		ctx = context.WithoutCancel(ctx)
	}
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var req ledgerRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fail := func(err error) {
		// A serialization failure, deadlock or lost connection is the
		// database's, not the handler's: 503, and the retry executes.
		if idempotency.IsTransient(err) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
	if s.isolation != "" {
		if _, err := tx.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL "+s.isolation); err != nil {
			fail(err)
			return
		}
	}
	var total int64
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(SUM(balance), 0) FROM account").Scan(&total); err != nil {
		fail(err)
		return
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx, run)
	}
	var balance int64
	if err := tx.QueryRowContext(ctx, "UPDATE account SET balance = balance - $1 WHERE id = $2 RETURNING balance",
		req.Amount, req.Account).Scan(&balance); err != nil {
		fail(err)
		return
	}
	_, key, _ := idempotency.KeyFromContext(ctx)
	var id int64
	if err := tx.QueryRowContext(ctx, "INSERT INTO ledger (account, amount, idem_key) VALUES ($1, $2, $3) RETURNING id",
		req.Account, req.Amount, key).Scan(&id); err != nil {
		fail(err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/ledger/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"ledger_id":%d,"balance":%d,"total_before":%d}`, id, balance, total)
}

// testBundle is the ledger service behind the middleware over a fresh
// schema, served on loopback.
type testBundle struct {
	db    *sql.DB
	store *idempotency.SQLStore
	svc   *ledgerService
	srv   *httptest.Server
}

func setup(t *testing.T, cfg idempotency.Config, svc *ledgerService) *testBundle {
	t.Helper()
	db := newPostgres(t)
	_, err := db.Exec(`CREATE TABLE account (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO account VALUES (1, 1000), (2, 1000);
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account bigint NOT NULL, amount bigint NOT NULL, idem_key text NOT NULL)`)
	require.NoError(t, err)
	store := postgres.NewStore(db)
	mw, err := idempotency.New(store, &cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(svc))
	t.Cleanup(srv.Close)
	return &testBundle{db: db, store: store, svc: svc, srv: srv}
}

// answer is a response read in full.
type answer struct {
	Status int
	Header http.Header
	Body   string
}

func (a answer) problemType(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", a.Header.Get("Content-Type"), "body: %s", a.Body)
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(a.Body), &p))
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

func (b *testBundle) do(t *testing.T, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/ledger", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: string(raw)}
}

// doAsClient sends a request as a retrying client does (package client's
// policy): an answer with Retry-After (503, or 409 in progress) is sent
// again, each such answer logged, up to 20 times. Under load a pool that
// waits for a connection or a lock answers 503 with Retry-After; the
// contract is what the client ends with.
func (b *testBundle) doAsClient(t *testing.T, key, body string) answer {
	t.Helper()
	for try := 1; ; try++ {
		a := b.do(t, key, body)
		if a.Header.Get("Retry-After") == "" || try == 20 {
			return a
		}
		t.Logf("key %s, try %d: %d with Retry-After %s: %s", key, try, a.Status, a.Header.Get("Retry-After"), a.Body)
		time.Sleep(20 * time.Millisecond)
	}
}

// storm sends n copies of one request at once and returns every answer.
func (b *testBundle) storm(t *testing.T, n int, key, body string) []answer {
	t.Helper()
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = b.do(t, key, body)
		})
	}
	close(start)
	wg.Wait()
	return answers
}

func (b *testBundle) count(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.QueryRow(query, args...).Scan(&n))
	return n
}

// forEachMode runs a specification against both modes.
func forEachMode(t *testing.T, spec func(t *testing.T, mode idempotency.Mode)) {
	for name, mode := range map[string]idempotency.Mode{"claim-first": idempotency.ModeClaimFirst, "single-phase": idempotency.ModeSinglePhase} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec(t, mode)
		})
	}
}

// pause sleeps for d unless ctx ends first.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func TestStorm_32RequestsOneKey_OneEffect_EveryAnswerTheSame201OrInProgress(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		svc := &ledgerService{beforeWrite: func(ctx context.Context, _ int32) { pause(ctx, 50*time.Millisecond) }}
		b := setup(t, idempotency.Config{Mode: mode}, svc)

		answers := b.storm(t, 32, "storm-1", `{"account":1,"amount":5}`)
		var first string
		var created, inProgress int
		for i, a := range answers {
			switch a.Status {
			case http.StatusCreated:
				created++
				if first == "" {
					first = a.Body
				}
				require.Equal(t, first, a.Body, "answer %d: every 201 is the same order", i)
			case http.StatusConflict:
				inProgress++
				require.Equal(t, "in-progress", a.problemType(t), "answer %d", i)
				require.Equal(t, "1", a.Header.Get("Retry-After"), "answer %d", i)
			default:
				t.Fatalf("answer %d: %d %s", i, a.Status, a.Body)
			}
		}
		require.NotZero(t, created)
		require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"), "one effect")
		require.EqualValues(t, 995, b.count(t, "SELECT balance FROM account WHERE id = 1"))
		if mode == idempotency.ModeClaimFirst {
			require.EqualValues(t, 1, svc.runs.Load(), "claim-first runs the handler once")
		}
		t.Logf("mode %v: %d×201, %d×409 in-progress, %d handler runs", mode, created, inProgress, svc.runs.Load())

		replay := b.do(t, "storm-1", `{"account":1,"amount":5}`)
		require.Equal(t, http.StatusCreated, replay.Status)
		require.Equal(t, first, replay.Body)
		require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	})
}

func TestStorm_32DistinctKeys_32Effects(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, &ledgerService{})
		var wg sync.WaitGroup
		statuses := make([]int, 32)
		for i := range 32 {
			wg.Go(func() { statuses[i] = b.do(t, fmt.Sprint("distinct-", i), `{"account":2,"amount":1}`).Status })
		}
		wg.Wait()
		for i, s := range statuses {
			require.Equal(t, http.StatusCreated, s, "request %d", i)
		}
		require.EqualValues(t, 32, b.count(t, "SELECT COUNT(*) FROM ledger"))
		require.EqualValues(t, 968, b.count(t, "SELECT balance FROM account WHERE id = 2"))
	})
}

// fingerprintOfBody makes the fingerprint computable by the test, so that it
// can plant the record a dead attempt would have left.
func fingerprintOfBody(_ *http.Request, body []byte) (string, error) {
	return "fp:" + string(body), nil
}

func TestTakeover_AfterTheLeaseOfADeadAttemptExpires_ExecutesOnceAndFencesTheDead(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{FingerprintFunc: fingerprintOfBody}, &ledgerService{})
	const body = `{"account":1,"amount":7}`
	ctx := context.Background()
	dead, err := b.store.Claim(ctx, idempotency.Claim{
		Scope: "", Key: "takeover-1", Fingerprint: "fp:" + body, Owner: "dead-instance/1",
		Lease: 200 * time.Millisecond, Retention: time.Hour,
	})
	require.NoError(t, err)

	live := b.do(t, "takeover-1", body)
	require.Equal(t, http.StatusConflict, live.Status, "the lease still holds: %s", live.Body)
	require.Equal(t, "in-progress", live.problemType(t))

	require.Eventually(t, func() bool {
		rec, err := b.store.Lookup(ctx, "", "takeover-1")
		return err == nil && rec.LeaseExpired
	}, 5*time.Second, 10*time.Millisecond)
	taken := b.do(t, "takeover-1", body)
	require.Equal(t, http.StatusCreated, taken.Status, taken.Body)
	require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))

	rec, err := b.store.Lookup(ctx, "", "takeover-1")
	require.NoError(t, err)
	require.Equal(t, idempotency.StatusDone, rec.Status)
	require.NotEqual(t, dead.Owner, rec.Owner)
	require.EqualValues(t, 3, rec.Version, "taken over (2), then finished (3)")

	_, err = b.store.Finish(ctx, dead, idempotency.StatusDone,
		&idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte("{}")}, time.Hour)
	require.ErrorIs(t, err, idempotency.ErrLeaseLost, "the dead attempt cannot finish")
	require.ErrorIs(t, b.store.Release(ctx, dead), idempotency.ErrLeaseLost, "nor release its successor's record")
}

func TestFencing_AStaleHolderThatOutlivesItsLease_CannotCommit(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "REPEATABLE READ", "SERIALIZABLE"} {
		name := isolation
		if name == "" {
			name = "READ COMMITTED"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			wake := make(chan struct{})
			svc := &ledgerService{isolation: isolation, ignoreDeadline: true}
			svc.beforeWrite = func(_ context.Context, run int32) {
				if run == 1 { // the first attempt stalls past its lease, ignoring its deadline,
					<-wake // until its successor has committed
				}
			}
			b := setup(t, idempotency.Config{Lease: time.Second}, svc)
			const body = `{"account":1,"amount":11}`

			stale := make(chan answer, 1)
			go func() { stale <- b.do(t, "fenced-1", body) }()
			require.Eventually(t, func() bool { // by the database's clock
				rec, err := b.store.Lookup(context.Background(), "", "fenced-1")
				return err == nil && rec.Status == idempotency.StatusProcessing && rec.LeaseExpired
			}, 30*time.Second, 10*time.Millisecond, "the stale holder's claim never showed an expired lease")
			successor := b.do(t, "fenced-1", body)
			close(wake)
			require.Equal(t, http.StatusCreated, successor.Status, successor.Body)

			late := <-stale
			t.Logf("%s: the stale holder answered %d", name, late.Status)
			if isolation == "" {
				// Its writes succeed; the fenced finish matches no row.
				require.Equal(t, http.StatusCreated, late.Status, "the stale holder answers with its successor's order: %s", late.Body)
				require.Equal(t, successor.Body, late.Body)
				require.Equal(t, "true", late.Header.Get("Idempotent-Replayed"))
			} else {
				// Its first write meets the successor's committed change:
				// 40001, answered 503 by the handler (a retry replays), or
				// the fenced finish matches no row and the successor's
				// order is replayed.
				switch late.Status {
				case http.StatusServiceUnavailable:
					require.Equal(t, "1", late.Header.Get("Retry-After"))
				case http.StatusCreated:
					require.Equal(t, successor.Body, late.Body)
				default:
					t.Fatalf("stale holder: %d %s", late.Status, late.Body)
				}
			}
			require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"), "the stale holder's writes rolled back")
			require.EqualValues(t, 989, b.count(t, "SELECT balance FROM account WHERE id = 1"))
		})
	}
}
