package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// The specifications of OpenDB: single-phase's record INSERT travels with
// the COMMIT, and everything a separate INSERT would do still holds.

// sends records what a pool's connections send, one entry per round trip
// once statements are prepared: a statement's SQL, or a batch's statements
// joined by " + ".
type sends struct {
	mu       sync.Mutex
	log      []string
	prepares int
	batch    []string
}

func (s *sends) add(entry string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, entry)
}

func (s *sends) take() (log []string, prepares int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	log, prepares = s.log, s.prepares
	s.log, s.prepares = nil, 0
	return log, prepares
}

func (s *sends) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(firstWords(d.SQL))
	return ctx
}

func (s *sends) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *sends) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	s.batch = nil
	s.mu.Unlock()
	return ctx
}

func (s *sends) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	s.batch = append(s.batch, firstWords(d.SQL))
	s.mu.Unlock()
}

func (s *sends) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	s.mu.Lock()
	batch := strings.Join(s.batch, " + ")
	s.mu.Unlock()
	s.add(batch)
}

func (s *sends) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	s.mu.Lock()
	s.prepares++
	s.mu.Unlock()
	return ctx
}

func (s *sends) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// firstWords names a statement by its first three words.
func firstWords(sql string) string {
	f := strings.Fields(strings.ToLower(sql))
	return strings.Join(f[:min(3, len(f))], " ")
}

// tracedPool opens a one-connection pool on a fresh schema with open
// (postgres.OpenDB or stdlib.OpenDB), migrated, whose sends are recorded.
func tracedPool(t *testing.T, open func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB) (*sql.DB, *sends) {
	t.Helper()
	_, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	tr := &sends{}
	cfg.Tracer = tr
	db := open(*cfg)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, postgres.Migrate(context.Background(), db))
	_, err = db.Exec(`CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, idem_key text NOT NULL)`)
	require.NoError(t, err)
	return db, tr
}

// appendLedger is a single-phase handler with one statement of its own.
var appendLedger = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	tx, _ := idempotency.TxFromContext(r.Context())
	_, key, _ := idempotency.KeyFromContext(r.Context())
	if _, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (idem_key) VALUES ($1)", key); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"ok":true}`))
})

func TestOpenDB_ANewKeyCostsTheRoundTripsOfTheBareCreate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB
		want []string
	}{
		// BEGIN, the handler's INSERT, then the record and the COMMIT together.
		{"postgres.OpenDB", postgres.OpenDB, []string{"begin", "insert into ledger", "insert into idempotency_record + commit"}},
		// pgx's own driver: the record is a round trip of its own.
		{"stdlib.OpenDB", stdlib.OpenDB, []string{"begin", "insert into ledger", "insert into idempotency_record", "commit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, tr := tracedPool(t, tc.open)
			mw, err := idempotency.New(postgres.NewStore(db), &idempotency.Config{Mode: idempotency.ModeSinglePhase})
			require.NoError(t, err)
			srv := httptest.NewServer(mw.Handler(appendLedger))
			t.Cleanup(srv.Close)
			post := func(key string) int {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				return resp.StatusCode
			}

			// Warm-up: prepares the statements, and a new process reads
			// the record first for its first 256 requests (replayHint).
			for i := range 256 {
				require.Equal(t, http.StatusCreated, post(fmt.Sprint("warm-up-", i)))
			}
			tr.take()
			require.Equal(t, http.StatusCreated, post("new-key"))
			log, prepares := tr.take()
			require.Equal(t, tc.want, log)
			require.Zero(t, prepares)

			var records, rows int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM idempotency_record WHERE idempotency_key = 'new-key' AND status = 'DONE'`).Scan(&records))
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM ledger WHERE idem_key = 'new-key'`).Scan(&rows))
			require.Equal(t, []int{1, 1}, []int{records, rows}, "the record and the order committed together")
		})
	}
}

// storeTx begins a business transaction through the store and appends one
// ledger row in it.
func storeTx(t *testing.T, store idempotency.Store, key string) *sql.Tx {
	t.Helper()
	tx, err := store.BeginTx(context.Background())
	require.NoError(t, err)
	_, err = tx.Exec("INSERT INTO ledger (idem_key) VALUES ($1)", key)
	require.NoError(t, err)
	return tx
}

func finalClaim(key string) idempotency.Claim {
	return idempotency.Claim{Scope: "s", Key: key, Fingerprint: "fp", Owner: "o-" + key, Retention: 3600e9}
}

func doneSnapshot() *idempotency.Snapshot {
	return &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{}, Body: []byte(`{}`)}
}

func TestOpenDB_ATakenKey_FailsTheCommitAsErrKeyClaimed_AndCommitsNothing(t *testing.T) {
	t.Parallel()
	db, _ := tracedPool(t, postgres.OpenDB)
	store := postgres.NewStore(db)
	ctx := context.Background()
	require.NoError(t, store.InsertFinal(ctx, nil, finalClaim("taken"), idempotency.StatusDone, doneSnapshot()))

	tx := storeTx(t, store, "taken")
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("taken"), idempotency.StatusDone, doneSnapshot()),
		"the INSERT waits for the COMMIT")
	err := tx.Commit()
	require.ErrorIs(t, err, idempotency.ErrKeyClaimed)

	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows))
	require.Zero(t, rows, "the business row rolled back with the record")
	rec, err := store.Lookup(ctx, "s", "taken")
	require.NoError(t, err)
	require.Equal(t, "o-taken", rec.Owner, "the first record is untouched")

	// The one connection is usable again: the next transaction commits.
	tx = storeTx(t, store, "free")
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("free"), idempotency.StatusDone, doneSnapshot()))
	require.NoError(t, tx.Commit())
	_, err = store.Lookup(ctx, "s", "free")
	require.NoError(t, err)
}

func TestOpenDB_AStatementAfterTheHeldBackInsert_SeesIt(t *testing.T) {
	t.Parallel()
	db, tr := tracedPool(t, postgres.OpenDB)
	store := postgres.NewStore(db)
	ctx := context.Background()
	tx := storeTx(t, store, "k")
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("k"), idempotency.StatusDone, doneSnapshot()))
	tr.take()

	var n int
	require.NoError(t, tx.QueryRow(`SELECT count(*) FROM idempotency_record WHERE idempotency_key = 'k'`).Scan(&n))
	require.Equal(t, 1, n, "statements run in the order they were given")
	require.NoError(t, tx.Commit())
	log, _ := tr.take()
	require.Equal(t, []string{"insert into idempotency_record", "select count(*) from", "commit"}, log)
}

func TestOpenDB_RollbackDropsTheHeldBackInsert(t *testing.T) {
	t.Parallel()
	db, _ := tracedPool(t, postgres.OpenDB)
	store := postgres.NewStore(db)
	ctx := context.Background()
	tx := storeTx(t, store, "k")
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("k"), idempotency.StatusDone, doneSnapshot()))
	require.NoError(t, tx.Rollback())

	_, err := store.Lookup(ctx, "s", "k")
	require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
	tx = storeTx(t, store, "other") // the same connection: nothing left over
	require.NoError(t, tx.Commit())
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows))
	require.Equal(t, 1, rows)
	_, err = store.Lookup(ctx, "s", "k")
	require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
}

// A statement error that reaches single-phase through the COMMIT proves
// that nothing committed: on a pool from OpenDB the record INSERT travels
// with the COMMIT, and the server's refusal of it (here a CHECK an operator
// added) aborts the transaction before the COMMIT runs. The answer says
// nothing was recorded, not that the outcome is unknown.
func TestSinglePhase_TheRecordInsertRefusedByTheServer_IsNotAnOutcomeUnknown_AndNothingCommits(t *testing.T) {
	t.Parallel()
	svc := &ledgerService{}
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, svc)
	_, err := b.db.Exec(`ALTER TABLE idempotency_record ADD CONSTRAINT no_refused_keys CHECK (idempotency_key <> 'refused')`)
	require.NoError(t, err)

	a := b.do(t, "refused", `{"account":1,"amount":5}`)
	require.NotEqual(t, idempotency.ProblemCommitUnknown, a.problemType(t),
		"the server refused a statement, which proves nothing committed; got %d %s", a.Status, a.Body)
	require.Equal(t, http.StatusServiceUnavailable, a.Status, "an infrastructure fault: %s", a.Body)
	require.Equal(t, idempotency.ProblemStoreUnavailable, a.problemType(t))
	require.Zero(t, b.count(t, "SELECT count(*) FROM ledger"), "the handler's row rolled back with the record")
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_record"))
}
