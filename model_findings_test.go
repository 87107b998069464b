package idempotency_test

import (
	"context"
	"database/sql/driver"
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
)

// The specs of the issues the protocol's model found (model/README.md):
// each forces the interleaving SPIN's counterexample names.

// failingRejections fails every Finish of a FAILED record as a dropped
// connection does, having written nothing.
type failingRejections struct{ idempotency.Store }

func (f failingRejections) Finish(ctx context.Context, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	if st == idempotency.StatusFailed {
		return idempotency.Lease{}, driver.ErrBadConn
	}
	return f.Store.Finish(ctx, l, st, snap, retention)
}

// S3: request A's handler outlives its lease and refuses (422); meanwhile B,
// the same request, takes the key over and commits the order (201). A's
// Finish of its rejection fails as a dropped connection does, and its
// release matches nothing: A must not answer 422 for a request whose order
// exists. It answers the key's record: B's order.
func TestClaimFirst_RejectionWhoseLeaseWasTakenOver_AnswersTheRecordNotTheRejection(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	_, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	store := idempotency.NewMySQLStore(db)
	mw, err := idempotency.New(failingRejections{store}, &idempotency.Config{Lease: time.Second, Retention: time.Hour, ReplayCacheBytes: -1})
	require.NoError(t, err)

	var runs atomic.Int32
	refuse := make(chan struct{}) // A answers when it is closed
	var refuseOnce sync.Once
	t.Cleanup(func() { refuseOnce.Do(func() { close(refuse) }) })
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 { // A: past its lease, then a refusal
			<-refuse
			http.Error(w, "refused", http.StatusUnprocessableEntity)
			return
		}
		tx, _ := idempotency.TxFromContext(r.Context())
		res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('order')")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	})))
	t.Cleanup(srv.Close)
	client, send := &testBundle{srv: srv}, call{key: "outlived", body: `{"sku":1}`}
	a := make(chan answer, 1)
	go func() { a <- client.do(t, send) }()
	require.Eventually(t, func() bool {
		rec, err := store.Lookup(context.Background(), "", "outlived")
		return err == nil && rec.Status == idempotency.StatusProcessing && rec.LeaseExpired
	}, 30*time.Second, 10*time.Millisecond, "A's lease never expired by the database's clock")

	b := client.do(t, send) // B takes the key over and commits
	require.Equal(t, http.StatusCreated, b.Status, b.Body)
	refuseOnce.Do(func() { close(refuse) })
	got := <-a

	var orders int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM ledger").Scan(&orders))
	require.Equal(t, 1, orders, "B's order exists")
	require.Equal(t, http.StatusCreated, got.Status,
		"A answered %d %q for a request whose order exists; it must answer the key's record (B's 201 %s)", got.Status, got.Body, b.Body)
	require.Equal(t, b.Body, got.Body)
}

// landedThenVanished is a store whose first Claim lands but loses its
// reply (a dropped connection), after which its record vanishes, as when
// another attempt took the expired claim over and released it. It keeps
// the lease that first claim made: what a reconciler that read the record
// then holds.
type landedThenVanished struct {
	idempotency.Store
	mu     sync.Mutex
	first  *idempotency.Lease
	owners []string
}

func (s *landedThenVanished) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	s.mu.Lock()
	s.owners = append(s.owners, c.Owner)
	first := s.first == nil
	s.mu.Unlock()
	lease, err := s.Store.Claim(ctx, c)
	if err != nil || !first {
		return lease, err
	}
	s.mu.Lock()
	s.first = &lease
	s.mu.Unlock()
	if err := s.Store.Release(ctx, lease); err != nil {
		return idempotency.Lease{}, err
	}
	return idempotency.Lease{}, driver.ErrBadConn
}

// S5: a request whose first claim landed (its reply lost) and vanished
// claims again. The new claim must not carry the first one's owner and
// version: a statement fenced by the first lease (a reconciler's release
// read before) would delete the new, live claim, and a duplicate could run
// beside it. So each round of a claim has a fresh owner, and the stale
// release, sent while the handler runs, matches nothing.
func TestClaimFirst_AClaimAgainAfterALandedClaimVanished_HasAFreshOwner(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	store := &landedThenVanished{Store: idempotency.NewMySQLStore(db)}
	mw, err := idempotency.New(store, &idempotency.Config{ReplayCacheBytes: -1})
	require.NoError(t, err)
	var staleRelease error
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		store.mu.Lock()
		stale := *store.first
		store.mu.Unlock()
		staleRelease = store.Store.Release(r.Context(), stale) // the reconciler's, read from the first record
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "claimed-twice")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	require.Len(t, store.owners, 2, "the request claimed twice")
	require.NotEqual(t, store.owners[0], store.owners[1], "the second claim has an owner of its own")
	require.ErrorIs(t, staleRelease, idempotency.ErrLeaseLost, "a release fenced by the first claim's lease matches nothing")
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	rec, err := store.Lookup(context.Background(), "", "claimed-twice")
	require.NoError(t, err)
	require.Equal(t, idempotency.StatusDone, rec.Status, "the live claim finished")
}

// landedRejection is a store whose Finish of a rejection lands but loses
// its reply, as a dropped connection does, and whose next Lookup fails the
// same way.
type landedRejection struct {
	idempotency.Store
	failLookup atomic.Bool
}

func (s *landedRejection) Finish(ctx context.Context, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	lease, err := s.Store.Finish(ctx, l, st, snap, retention)
	if err != nil || st != idempotency.StatusFailed {
		return lease, err
	}
	s.failLookup.Store(true)
	return idempotency.Lease{}, driver.ErrBadConn
}

func (s *landedRejection) Lookup(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if s.failLookup.CompareAndSwap(true, false) {
		return nil, driver.ErrBadConn
	}
	return s.Store.Lookup(ctx, scope, key)
}

// Found by the fault runs' history check: a rejection whose Finish landed
// with its reply lost, whose release then matched nothing, and whose first
// re-read failed, answered its own record as a replay (Idempotent-Replayed:
// true) of an answer no client had heard. The record is the attempt's own
// answer: it is answered as such, and a retry gets it as the replay.
func TestClaimFirst_RejectionWhoseFinishLandedUnheard_IsAnsweredAsItsOwnNotAsAReplay(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	mw, err := idempotency.New(&landedRejection{Store: idempotency.NewMySQLStore(db)}, &idempotency.Config{ReplayCacheBytes: -1})
	require.NoError(t, err)
	var runs atomic.Int32
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		http.Error(w, "unknown sku", http.StatusUnprocessableEntity)
	})))
	t.Cleanup(srv.Close)
	client, send := &testBundle{srv: srv}, call{key: "rejected", body: `{"sku":99999}`}
	first := client.do(t, send)
	require.Equal(t, http.StatusUnprocessableEntity, first.Status, first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"), "the first answer the key gives is not a replay: this request executed")
	again := client.do(t, send)
	require.Equal(t, http.StatusUnprocessableEntity, again.Status, again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Body, again.Body, "the retry replays the first answer")
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
}
