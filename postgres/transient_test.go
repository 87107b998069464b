package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// The SQLSTATEs idempotency.IsTransient classifies, as a real PostgreSQL
// raises them on demand, without changing the server's configuration (each
// setting is the session's). Those it cannot raise so (disk full 53100,
// out of memory 53200, I/O error 58030, statement completion unknown 40003)
// are constructed in the root package's transient_test.go.

// requireState asserts that err carries SQLSTATE want and is transient.
func requireState(t *testing.T, err error, want string) {
	t.Helper()
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "want SQLSTATE %s, got %v", want, err)
	require.Equal(t, want, pe.Code, "got %v", err)
	require.True(t, idempotency.IsTransient(err), "%s is transient: the same request may succeed when tried again (%v)", want, err)
}

// sessionConn returns a connection of its own with the session settings
// given, and its backend's pid. The connection is closed when the test
// ends, not returned to the pool with its settings.
func sessionConn(t *testing.T, db *sql.DB, settings ...string) (*sql.Conn, int) {
	t.Helper()
	ctx := context.Background()
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Raw(func(any) error { return driver.ErrBadConn }) // database/sql discards it
		c.Close()
	})
	// The pid first and the settings last: a timeout a setting arms (an
	// idle session's, 20 ms) starts after the last statement here, never
	// between two of them on a busy machine.
	var pid int
	require.NoError(t, c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	for _, s := range settings {
		_, err := c.ExecContext(ctx, s)
		require.NoError(t, err)
	}
	return c, pid
}

// awaitBackendGone waits until the server has ended the backend pid: the
// server's own timer, not the test's, decides when.
func awaitBackendGone(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		return db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n) == nil && n == 0
	}, 15*time.Second, 5*time.Millisecond, "the server ends backend %d", pid)
}

// requireSessionEndedWith asserts the error of a statement on a session the
// server ended: the FATAL it sent (want), or, if the client saw the socket
// close first, a lost connection. Either is transient.
func requireSessionEndedWith(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, idempotency.IsTransient(err), "a session the server ended is transient: %v", err)
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		require.Equal(t, want, pe.Code, "got %v", err)
	}
	t.Logf("the ended session's statement failed with: %v", err)
}

func TestIsTransient_Postgres_ErrorsTheServerRaisesOnDemand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newPostgres(t)
	_, err := db.Exec("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
	require.NoError(t, err)

	t.Run("ReadOnlyTransaction_25006", func(t *testing.T) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}) // what a standby, or a demoted primary, answers
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck
		_, err = tx.Exec("INSERT INTO t VALUES (3)")
		requireState(t, err, "25006")
	})

	t.Run("StatementTimeout_57014", func(t *testing.T) {
		c, _ := sessionConn(t, db, "SET statement_timeout = '10ms'")
		_, err := c.ExecContext(ctx, "SELECT pg_sleep(5)")
		requireState(t, err, "57014")
	})

	t.Run("Deadlock_40P01", func(t *testing.T) {
		first, firstPID := sessionConn(t, db)
		second, _ := sessionConn(t, db)
		for _, step := range []struct {
			c   *sql.Conn
			sql string
		}{{first, "BEGIN"}, {second, "BEGIN"}, {second, "SELECT id FROM t WHERE id = 2 FOR UPDATE"}, {first, "SELECT id FROM t WHERE id = 1 FOR UPDATE"}} {
			_, err := step.c.ExecContext(ctx, step.sql)
			require.NoError(t, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := first.ExecContext(ctx, "SELECT id FROM t WHERE id = 2 FOR UPDATE")
			done <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			return db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", firstPID).Scan(&n) == nil && n == 1
		}, 15*time.Second, 5*time.Millisecond, "first waits for row 2")
		_, secondErr := second.ExecContext(ctx, "SELECT id FROM t WHERE id = 1 FOR UPDATE")
		_, _ = second.ExecContext(ctx, "ROLLBACK")
		firstErr := <-done
		_, _ = first.ExecContext(ctx, "ROLLBACK")
		if secondErr == nil {
			secondErr = firstErr // the server chose first as the victim
		}
		requireState(t, secondErr, "40P01")
	})

	t.Run("TerminatedBackend_57P01", func(t *testing.T) {
		c, pid := sessionConn(t, db)
		_, err := db.Exec("SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
		awaitBackendGone(t, db, pid)
		_, err = c.ExecContext(ctx, "SELECT 1")
		requireSessionEndedWith(t, err, "57P01")
	})

	t.Run("IdleInTransactionTimeout_25P03", func(t *testing.T) {
		c, pid := sessionConn(t, db, "SET idle_in_transaction_session_timeout = '20ms'")
		_, err := c.ExecContext(ctx, "BEGIN")
		require.NoError(t, err)
		awaitBackendGone(t, db, pid)
		_, err = c.ExecContext(ctx, "INSERT INTO t VALUES (4)")
		requireSessionEndedWith(t, err, "25P03")
	})

	t.Run("IdleSessionTimeout_57P05", func(t *testing.T) {
		c, pid := sessionConn(t, db, "SET idle_session_timeout = '20ms'")
		awaitBackendGone(t, db, pid)
		_, err := c.ExecContext(ctx, "SELECT 1")
		requireSessionEndedWith(t, err, "57P05")
	})

	t.Run("RoleConnectionLimit_53300", func(t *testing.T) {
		var b [4]byte
		_, _ = rand.Read(b[:])
		role := "idem_limit_" + hex.EncodeToString(b[:])
		_, err := db.Exec("CREATE ROLE " + role + " LOGIN CONNECTION LIMIT 0")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.Exec("DROP ROLE IF EXISTS " + role) })
		_, dsn := pgtest.Postgres(t)
		cfg, err := pgx.ParseConfig(dsn)
		require.NoError(t, err)
		cfg.User = role
		_, err = pgx.ConnectConfig(ctx, cfg) // not pgtest's pool, which waits out 53300
		requireState(t, err, "53300")
	})
}
