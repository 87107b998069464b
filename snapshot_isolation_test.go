package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// MariaDB 11.6.2+ turns innodb_snapshot_isolation ON by default (11.8 LTS
// has it): a REPEATABLE READ transaction that writes a row changed after its
// read view fails with 1020 and is rolled back whole. These specs turn it on
// for their session whatever the suite's setting, so they run in both of
// CI's passes.

// newSnapshotIsolationDB returns a fresh migrated database whose every
// connection runs with innodb_snapshot_isolation=ON, and a ledger table.
func newSnapshotIsolationDB(t *testing.T) *sql.DB {
	t.Helper()
	plain, dsn := testdb.MySQL(t)
	var v sql.NullString
	if err := plain.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&v); err != nil {
		t.Skipf("the server has no innodb_snapshot_isolation (MySQL, or MariaDB before 10.6.18): %v", err)
	}
	db, err := sql.Open("mysql", dsn+"&innodb_snapshot_isolation=ON")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&v))
	require.Equal(t, "1", v.String, "the session runs with snapshot isolation")
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	_, err = db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	return db
}

// heartbeatHandler reads (which makes its transaction's read view), then
// heartbeats, which changes the record after that view, then writes and
// answers 201.
func heartbeatHandler(w http.ResponseWriter, r *http.Request) {
	tx, _ := idempotency.TxFromContext(r.Context())
	var n int
	if err := tx.QueryRowContext(r.Context(), "SELECT COUNT(*) FROM ledger").Scan(&n); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := idempotency.ExtendLease(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	id, _ := res.LastInsertId()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"ledger_id":%d}`, id)
}

func TestSnapshotIsolation_HeartbeatDuringTheHandler_NeverFailsTheOwnersCommit(t *testing.T) {
	t.Parallel()
	db := newSnapshotIsolationDB(t)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), nil)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(heartbeatHandler)))
	t.Cleanup(srv.Close)
	b := &testBundle{db: db, srv: srv}

	first := b.do(t, call{key: "hb-1", body: `{"amount":5}`})
	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	retry := b.do(t, call{key: "hb-1", body: `{"amount":5}`})
	require.Equal(t, http.StatusCreated, retry.Status, retry.Body)
	require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Body, retry.Body)
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE'"))
}

// The control for the spec above: the same flow with the store's server
// adaptation left out hits 1020 at the finalize, which proves the session
// really reproduces the problem the adaptation solves. The attempt is
// rolled back and answered 503 (never 500, never a 2xx without its order).
func TestSnapshotIsolation_WithoutTheStatementOverride_TheFinalizeMeets1020(t *testing.T) {
	t.Parallel()
	db := newSnapshotIsolationDB(t)
	dialect := idempotency.MySQLDialect
	dialect.Adapt = nil
	mw, err := idempotency.New(idempotency.NewSQLStore(db, dialect), nil)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(heartbeatHandler)))
	t.Cleanup(srv.Close)
	b := &testBundle{db: db, srv: srv}

	a := b.do(t, call{key: "hb-1", body: `{"amount":5}`})
	require.Equal(t, http.StatusServiceUnavailable, a.Status, a.Body)
	require.Equal(t, idempotency.ProblemStoreUnavailable, a.problemType(t))
	require.NotEmpty(t, a.Header.Get("Retry-After"))
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM ledger"), "rolled back with the record")
	require.Zero(t, b.records(t), "released, so a retry executes")
}

// A single-phase duplicate whose read view was made before the winner
// committed meets the winner's record at its own record INSERT: it replays
// the winner instead of failing.
func TestSnapshotIsolation_SinglePhaseDuplicateOlderThanTheWinnersCommit_ReplaysIt(t *testing.T) {
	t.Parallel()
	db := newSnapshotIsolationDB(t)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1,
	})
	require.NoError(t, err)
	var (
		mu         sync.Mutex
		arrivals   int
		duplicate  = make(chan struct{}) // the duplicate has its read view
		winnerDone = make(chan struct{}) // the winner's answer arrived: it committed
	)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		var n int
		if err := tx.QueryRowContext(r.Context(), "SELECT COUNT(*) FROM ledger").Scan(&n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mu.Lock()
		arrivals++
		first := arrivals == 1
		mu.Unlock()
		if first {
			<-duplicate
		} else {
			close(duplicate)
			<-winnerDone
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"first":%t}`, first)
	})))
	t.Cleanup(srv.Close)
	b := &testBundle{db: db, srv: srv}

	winner := make(chan answer, 1)
	go func() { winner <- b.do(t, call{key: "sp-1", body: `{"amount":5}`}) }()
	// The duplicate starts once the winner is inside its handler.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return arrivals == 1 },
		5*time.Second, time.Millisecond)
	dup := make(chan answer, 1)
	go func() { dup <- b.do(t, call{key: "sp-1", body: `{"amount":5}`}) }()
	w := <-winner
	close(winnerDone)
	d := <-dup

	require.Equal(t, http.StatusCreated, w.Status, w.Body)
	require.Equal(t, http.StatusCreated, d.Status, d.Body)
	require.Equal(t, w.Body, d.Body, "the duplicate replays the winner")
	require.Equal(t, `{"first":true}`, d.Body)
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
}
