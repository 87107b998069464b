package postgres_test

import (
	"context"
	"database/sql"
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
	db, err := postgres.OpenWithGrowth(u.String(), grow)
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
	require.Eventually(t, func() bool { return limit() == postgres.MaxConns/2 }, 10*time.Second, time.Millisecond,
		"four connections died in one cut: the limit halves once, to %d (is %d)", postgres.MaxConns/2, limit())

	grow <- time.Now()
	require.Eventually(t, func() bool { return limit() == postgres.MaxConns/2+1 }, 10*time.Second, time.Millisecond,
		"a growth interval without a death: one more (is %d)", limit())

	cut()
	want := (postgres.MaxConns/2 + 1) / 2
	require.Eventually(t, func() bool { return limit() == want }, 10*time.Second, time.Millisecond,
		"the next cut ends connections made after the first: halved again, to %d (is %d)", want, limit())
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
