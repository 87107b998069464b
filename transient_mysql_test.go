package idempotency_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// The errors IsTransient classifies, as a real MariaDB raises them on
// demand, without changing the server's configuration. Those it cannot
// raise so (a read-only server 1290 and 1836, too many connections 1040,
// MySQL's 3024) are constructed in transient_test.go.

// mariaDBErrors is a table t(id) with rows 1 and 2 in a fresh database,
// and connections to it.
type mariaDBErrors struct {
	db *sql.DB
}

func newMariaDBErrors(t *testing.T) *mariaDBErrors {
	t.Helper()
	db, _ := testdb.MySQL(t)
	_, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO t VALUES (1), (2)")
	require.NoError(t, err)
	return &mariaDBErrors{db: db}
}

// conn returns a connection of its own and its server thread id.
func (e *mariaDBErrors) conn(t *testing.T) (*sql.Conn, int64) {
	t.Helper()
	c, err := e.db.Conn(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	var id int64
	require.NoError(t, c.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id))
	return c, id
}

// holdRow1 locks row 1 in a transaction that lasts until the test ends.
func (e *mariaDBErrors) holdRow1(t *testing.T) {
	t.Helper()
	c, _ := e.conn(t)
	tx, err := c.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	_, err = tx.Exec("SELECT id FROM t WHERE id = 1 FOR UPDATE")
	require.NoError(t, err)
}

// waitingForRow1 starts a locking read of row 1 on c and returns once the
// server shows thread id executing it, with a channel for its error.
func (e *mariaDBErrors) waitingForRow1(t *testing.T, c *sql.Conn, id int64) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(context.Background(), "SELECT id FROM t WHERE id = 1 FOR UPDATE")
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := e.db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE ID = ? AND COMMAND = 'Query' AND INFO LIKE 'SELECT id FROM t%'`, id).Scan(&n)
		return err == nil && n == 1
	}, 15*time.Second, 5*time.Millisecond, "thread %d waits for row 1", id)
	return done
}

// requireCode asserts err is the server's error number want and transient.
func requireCode(t *testing.T, err error, want uint16) {
	t.Helper()
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "want server error %d, got %v", want, err)
	require.Equal(t, want, me.Number, "got %v", err)
	require.True(t, idempotency.IsTransient(err), "%d is transient: the same request may succeed when tried again (%v)", want, err)
}

func TestIsTransient_MariaDB_ErrorsTheServerRaisesOnDemand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReadOnlyTransaction_1792", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		tx, err := e.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}) // START TRANSACTION READ ONLY
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck
		_, err = tx.Exec("INSERT INTO t VALUES (3)")
		requireCode(t, err, 1792)
	})

	t.Run("StatementTimeout_1969", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		// A lock wait, not SLEEP(): a SLEEP() that the timer interrupts
		// may just return 1, with no error (seen once in 36 runs on a
		// loaded machine). The row's holder keeps the wait going past the
		// statement's 0.1 s, well inside innodb_lock_wait_timeout.
		e.holdRow1(t)
		_, err := e.db.Exec("SET STATEMENT max_statement_time=0.1 FOR SELECT id FROM t WHERE id = 1 FOR UPDATE")
		requireCode(t, err, 1969)
	})

	t.Run("LockWaitTimeout_1205", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		e.holdRow1(t)
		_, err := e.db.Exec("SET STATEMENT innodb_lock_wait_timeout=1 FOR SELECT id FROM t WHERE id = 1 FOR UPDATE")
		requireCode(t, err, 1205)
	})

	t.Run("Deadlock_1213", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		first, firstID := e.conn(t)
		second, _ := e.conn(t)
		_, err := first.ExecContext(ctx, "BEGIN")
		require.NoError(t, err)
		_, err = second.ExecContext(ctx, "BEGIN")
		require.NoError(t, err)
		_, err = second.ExecContext(ctx, "SELECT id FROM t WHERE id = 2 FOR UPDATE")
		require.NoError(t, err)
		_, err = first.ExecContext(ctx, "SELECT id FROM t WHERE id = 1 FOR UPDATE")
		require.NoError(t, err)
		// first waits for row 2 (held by second); second then asks for row 1.
		done := make(chan error, 1)
		go func() {
			_, err := first.ExecContext(ctx, "SELECT id FROM t WHERE id = 2 FOR UPDATE")
			done <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			err := e.db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE ID = ? AND COMMAND = 'Query' AND INFO LIKE 'SELECT id FROM t%'`, firstID).Scan(&n)
			return err == nil && n == 1
		}, 15*time.Second, 5*time.Millisecond)
		_, secondErr := second.ExecContext(ctx, "SELECT id FROM t WHERE id = 1 FOR UPDATE")
		if secondErr == nil {
			_, _ = second.ExecContext(ctx, "ROLLBACK")
			secondErr = <-done // the server chose first as the victim
		} else {
			_, _ = second.ExecContext(ctx, "ROLLBACK")
			require.NoError(t, <-done)
		}
		_, _ = first.ExecContext(ctx, "ROLLBACK")
		requireCode(t, secondErr, 1213)
	})

	t.Run("KillQuery_1317", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		e.holdRow1(t)
		c, id := e.conn(t)
		done := e.waitingForRow1(t, c, id)
		_, err := e.db.Exec("KILL QUERY ?", id)
		require.NoError(t, err)
		requireCode(t, <-done, 1317)
	})

	t.Run("KillConnection_ConnectionKilledOrLost", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		e.holdRow1(t)
		c, id := e.conn(t)
		done := e.waitingForRow1(t, c, id)
		_, err := e.db.Exec("KILL CONNECTION ?", id)
		require.NoError(t, err)
		err = <-done
		require.Error(t, err)
		require.True(t, idempotency.IsTransient(err), "a killed connection is transient: %v", err)
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			require.EqualValues(t, 1927, me.Number, "MariaDB reports the kill as 1927: %v", err)
		}
		t.Logf("the killed connection's statement failed with: %v", err)
	})

	t.Run("UserConnectionLimit_1226", func(t *testing.T) {
		t.Parallel()
		e := newMariaDBErrors(t)
		var b [4]byte
		_, _ = rand.Read(b[:])
		user := "idem_limit_" + hex.EncodeToString(b[:])
		_, err := e.db.Exec("CREATE USER '" + user + "'@'%' WITH MAX_USER_CONNECTIONS 1")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = e.db.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
		cfg := testdb.BaseConfig(t).Clone()
		cfg.User, cfg.Passwd, cfg.DBName = user, "", ""
		limited, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { limited.Close() })
		held, err := limited.Conn(ctx) // the user's one connection
		require.NoError(t, err)
		t.Cleanup(func() { held.Close() })
		require.NoError(t, held.PingContext(ctx))
		_, err = limited.Conn(ctx)
		requireCode(t, err, 1226)
	})
}
