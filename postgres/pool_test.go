package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// Open's pool halves its limit when the network cuts its connections and
// grows it back while they live (pool.go has the rule on a stand-in): here
// on a real pool, through a proxy that resets every connection at once.
func TestOpen_ACutHalvesThePool_OnceLivingConnectionsGrowItBack(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	p := startCutProxy(t, u.Host)
	u.Host = p.addr
	grow := make(chan time.Time)
	db, deaths, err := postgres.OpenWithGrowth(u.String(), grow)
	require.NoError(t, err)
	defer db.Close()
	limit := func() int { return db.Stats().MaxOpenConnections }
	require.Equal(t, postgres.MaxConns, limit())

	cut := func() {
		hold(t, db, 4) // four pooled connections
		p.cut()        // all of them reset at once
		for range 8 {  // the requests after it find them dead, and new ones serve them
			var one int
			require.NoError(t, db.QueryRowContext(context.Background(), "SELECT 1").Scan(&one))
		}
	}
	cut()
	require.Equal(t, 1, deaths(), "four connections died in one cut: one death counts")
	require.Eventually(t, func() bool { return limit() == postgres.MaxConns/2 }, 10*time.Second, time.Millisecond,
		"four connections died in one cut: the limit halves once, to %d (is %d)", postgres.MaxConns/2, limit())

	grow <- time.Now()
	require.Eventually(t, func() bool { return limit() == postgres.MaxConns/2+1 }, 10*time.Second, time.Millisecond,
		"a growth interval without a death: one more (is %d)", limit())

	cut()
	require.Equal(t, 2, deaths(), "the second cut counts once more")
	want := (postgres.MaxConns/2 + 1) / 2
	require.Eventually(t, func() bool { return limit() == want }, 10*time.Second, time.Millisecond,
		"the next cut ends connections made after the first: halved again, to %d (is %d)", want, limit())
}

// A connection the network cuts while a statement uses it counts as one
// found dead in the pool does: under load every connection is in use when
// the cut comes.
func TestOpen_AConnectionCutInUse_CountsAsADeath(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.Postgres(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	p := startCutProxy(t, u.Host)
	u.Host = p.addr
	db, deaths, err := postgres.OpenWithGrowth(u.String(), make(chan time.Time))
	require.NoError(t, err)
	defer db.Close()

	c, _, running := sleepOn(t, db, admin)
	p.cut()
	require.Error(t, <-running, "the cut ends the statement")
	_ = c.Close() // database/sql has closed the broken connection, or closes it now (IsValid)
	require.Equal(t, 1, deaths(), "the connection the cut ended in use counts")
}

// A connection the server ends while a statement uses it (a shutdown, a
// failover, pg_terminate_backend) counts too: pgx reads the FATAL error and
// closes the socket itself, so no reset ever reaches it.
func TestOpen_AConnectionTheServerEndsInUse_CountsAsADeath(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.Postgres(t)
	db, deaths, err := postgres.OpenWithGrowth(dsn, make(chan time.Time))
	require.NoError(t, err)
	defer db.Close()

	c, pid, running := sleepOn(t, db, admin)
	var ended bool
	require.NoError(t, admin.QueryRow(`SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended))
	require.True(t, ended)
	requireSQLState(t, <-running, "57P01")
	_ = c.Close() // database/sql has closed the broken connection, or closes it now (IsValid)
	require.Equal(t, 1, deaths(), "the connection the server ended in use counts")
}

// A connection pgx closes because its statement's context ended (a client
// that hung up, a request's deadline) died of its request, not of the
// network: it does not shrink the pool, or a service whose clients time
// out under load would lose its connections when it needs them most.
func TestOpen_AStatementWhoseContextEnded_DoesNotShrinkThePool(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	db, deaths, err := postgres.OpenWithGrowth(dsn, make(chan time.Time))
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(1) // one connection: the next query takes the closed one from the pool
	pid := func() (pid int) {
		require.NoError(t, db.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
		return pid
	}
	before := pid()

	// Held as a transaction or a sql.Conn holds it, the connection goes
	// back to the pool only after pgx has finished closing it: drained
	// the socket to the server's end of stream.
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = c.ExecContext(ctx, "SELECT pg_sleep(30)")
	require.Error(t, err, "the statement outlives its context")
	require.NoError(t, c.Raw(func(dc any) error {
		select {
		case <-postgres.CleanupDone(dc):
			return nil
		case <-time.After(30 * time.Second):
			return errors.New("pgx never finished closing the connection")
		}
	}))
	require.NoError(t, c.Close())

	require.NotEqual(t, before, pid(), "pgx closed the connection whose statement's context ended: a new one serves the next query")
	require.Zero(t, deaths(), "a statement's own context ended its connection: no death, though the server then closed the socket")
}

// sleepOn takes a connection from db and runs a long statement on it;
// once the server (admin's) shows it running, it returns the connection,
// its backend's pid and where the statement's error will come.
func sleepOn(t *testing.T, db, admin *sql.DB) (c *sql.Conn, pid int, running <-chan error) {
	t.Helper()
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	require.NoError(t, c.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	ended := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(context.Background(), "SELECT pg_sleep(30)")
		ended <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%'`, pid).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the statement is running on the server")
	return c, pid, ended
}

// hold takes n connections from db at once and gives them back.
func hold(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(context.Background())
		require.NoError(t, err, "connection "+strconv.Itoa(i))
		require.NoError(t, c.PingContext(context.Background()))
		conns[i] = c
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
}
