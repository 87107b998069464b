package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
)

// The business transaction above READ COMMITTED, and PostgreSQL's errors.

// PostgreSQL has no per-statement way out of a transaction's snapshot (as
// MariaDB's SET STATEMENT innodb_snapshot_isolation=OFF is). At REPEATABLE
// READ or SERIALIZABLE, a claim-first heartbeat after the transaction's
// first statement bumps the record's lease_version after the snapshot, so
// the fenced finish, which sees the record as of the snapshot, matches no
// row: the attempt rolls back and is answered 409 in-progress with
// Retry-After, and its claim stays until the lease expires (then a retry
// takes it over). Never a 500, a lost or a second order; but such a handler
// cannot finish, so handlers that heartbeat run at READ COMMITTED.
func TestIsolation_HeartbeatAfterTheSnapshot_RollsBackAndAnswersInProgress(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "REPEATABLE READ", "SERIALIZABLE"} {
		name := isolation
		if name == "" {
			name = "READ COMMITTED"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc := &ledgerService{isolation: isolation}
			svc.beforeWrite = func(ctx context.Context, _ int32) {
				assert.NoError(t, idempotency.ExtendLease(ctx)) // in the handler's goroutine: no FailNow
			}
			b := setup(t, idempotency.Config{}, svc)
			a := b.do(t, "heartbeat-1", `{"account":1,"amount":2}`)
			rec, err := b.store.Lookup(context.Background(), "", "heartbeat-1")
			require.NoError(t, err)
			if isolation == "" {
				require.Equal(t, http.StatusCreated, a.Status, a.Body)
				require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
				require.Equal(t, idempotency.StatusDone, rec.Status)
				return
			}
			require.Equal(t, http.StatusConflict, a.Status, a.Body)
			require.Equal(t, "in-progress", a.problemType(t))
			require.Equal(t, "1", a.Header.Get("Retry-After"))
			require.EqualValues(t, 0, b.count(t, "SELECT COUNT(*) FROM ledger"), "rolled back")
			require.Equal(t, idempotency.StatusProcessing, rec.Status, "claimed until the lease expires")
			require.EqualValues(t, 2, rec.Version, "claimed (1), extended (2), never finished")
		})
	}
}

// A concurrent change to a row the handler read, committed between its read
// and its write: at REPEATABLE READ and SERIALIZABLE the write fails with
// 40001. The handler answers 503 (IsTransient recognises the SQLSTATE), the
// middleware rolls back and releases the key, and the retry commits.
func TestIsolation_SerializationFailureInTheHandler_Answers503ThenTheRetryCommits(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"REPEATABLE READ", "SERIALIZABLE"} {
		t.Run(isolation, func(t *testing.T) {
			t.Parallel()
			forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
				var db *sql.DB
				svc := &ledgerService{isolation: isolation}
				svc.beforeWrite = func(ctx context.Context, run int32) {
					if run == 1 { // another writer commits after our snapshot
						_, err := db.ExecContext(ctx, "UPDATE account SET balance = balance + 100 WHERE id = 1")
						assert.NoError(t, err) // in the handler's goroutine: no FailNow
					}
				}
				b := setup(t, idempotency.Config{Mode: mode}, svc)
				db = b.db
				const body = `{"account":1,"amount":3}`

				first := b.do(t, "serial-1", body)
				require.Equal(t, http.StatusServiceUnavailable, first.Status, first.Body)
				require.Equal(t, "1", first.Header.Get("Retry-After"))
				require.Contains(t, first.Body, "SQLSTATE 40001")
				require.EqualValues(t, 0, b.count(t, "SELECT COUNT(*) FROM ledger"))

				retry := b.do(t, "serial-1", body)
				require.Equal(t, http.StatusCreated, retry.Status, retry.Body)
				require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
				require.EqualValues(t, 1097, b.count(t, "SELECT balance FROM account WHERE id = 1"))
			})
		})
	}
}

// Write skew under SERIALIZABLE: two requests with different keys each read
// both accounts and debit one. PostgreSQL lets only one of them commit; the
// other fails with 40001 in its handler, in the record's statement or at
// COMMIT. Whatever the place, the answer is 201 (single-phase runs the
// handler again), or 503 with Retry-After and the key released: never 500.
func TestSerializable_WriteSkew_IsA503OrARerun_Never500(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		var bothRead sync.WaitGroup
		bothRead.Add(2)
		svc := &ledgerService{isolation: "SERIALIZABLE"}
		svc.beforeWrite = func(ctx context.Context, run int32) {
			if run <= 2 {
				bothRead.Done()
				waited := make(chan struct{})
				go func() { bothRead.Wait(); close(waited) }()
				select {
				case <-waited:
				case <-ctx.Done():
				}
			}
		}
		b := setup(t, idempotency.Config{Mode: mode}, svc)

		bodies := []string{`{"account":1,"amount":600}`, `{"account":2,"amount":600}`}
		first := make([]answer, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() { first[i] = b.do(t, fmt.Sprint("skew-", i), bodies[i]) })
		}
		wg.Wait()
		var unavailable int
		for i, a := range first {
			switch a.Status {
			case http.StatusCreated:
			case http.StatusServiceUnavailable:
				unavailable++
				require.Equal(t, "1", a.Header.Get("Retry-After"), "answer %d", i)
			default:
				t.Fatalf("answer %d: %d %s", i, a.Status, a.Body)
			}
		}
		t.Logf("mode %v: %d of 2 answered 503, %d handler runs", mode, unavailable, svc.runs.Load())
		require.Greater(t, int(svc.runs.Load())+unavailable, 2, "one transaction was refused: a 503 or a second run")
		for i := range 2 {
			a := b.do(t, fmt.Sprint("skew-", i), bodies[i])
			require.Equal(t, http.StatusCreated, a.Status, "retry %d: %s", i, a.Body)
		}
		require.EqualValues(t, 2, b.count(t, "SELECT COUNT(*) FROM ledger"))
		require.EqualValues(t, 800, b.count(t, "SELECT SUM(balance) FROM account"))
	})
}

// The store classifies PostgreSQL's refusals by SQLSTATE, through pgx's
// *pgconn.PgError, and so does idempotency.IsTransient without importing pgx.
func TestErrors_RealServerErrors_AreClassifiedBySQLState(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	_, err := db.Exec("CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO t VALUES (1)")
	require.NoError(t, err)

	_, dup := db.Exec("INSERT INTO t VALUES (1)")
	require.True(t, postgres.Dialect.IsDuplicate(dup), "23505: %v", dup)
	require.False(t, idempotency.IsTransient(dup), "a duplicate is final")

	_, syntax := db.Exec("SELEKT 1")
	require.False(t, idempotency.IsTransient(syntax), "a bug is not transient: %v", syntax)

	holder, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback() //nolint:errcheck
	_, err = holder.Exec("SELECT * FROM t WHERE id = 1 FOR UPDATE")
	require.NoError(t, err)
	_, locked := db.Exec("SELECT * FROM t WHERE id = 1 FOR UPDATE NOWAIT")
	require.True(t, postgres.Dialect.IsTransient(locked), "55P03: %v", locked)
	require.True(t, idempotency.IsTransient(locked), "55P03: %v", locked)

	reader, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer reader.Rollback() //nolint:errcheck
	_, err = reader.Exec("SELECT * FROM t")
	require.NoError(t, err)
	require.NoError(t, holder.Rollback())
	_, err = db.Exec("UPDATE t SET id = 2 WHERE id = 1")
	require.NoError(t, err)
	_, serial := reader.Exec("UPDATE t SET id = 3 WHERE id = 1")
	require.True(t, postgres.Dialect.IsTransient(serial), "40001: %v", serial)
	require.True(t, idempotency.IsTransient(serial), "40001: %v", serial)

	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	var pid int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = db.Exec("SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, lost := conn.ExecContext(ctx, "SELECT 1")
	require.Error(t, lost)
	require.True(t, idempotency.IsTransient(lost), "a terminated connection: %v", lost)
	require.False(t, errors.Is(lost, sql.ErrNoRows))
}
