package faultproxy_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/faultproxy"
	"github.com/orderguard/idempotency/internal/testdb"
)

// resetSlack is how much later than the drawn interval a reset may be seen
// on a loaded machine (two cores, the race detector, other tests).
const resetSlack = 500 * time.Millisecond

// exchange sends one query through c and reads the server's OK.
func exchange(t *testing.T, srv *fakeServer, c net.Conn) {
	t.Helper()
	_, err := c.Write(query("SELECT 1"))
	require.NoError(t, err)
	require.Equal(t, "\x03SELECT 1", string(srv.next(t)))
	readOK(t, c)
}

// readsReset asserts that the connection is reset: not closed in order, not
// left open.
func readsReset(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := c.Read(make([]byte, 64))
	require.Zero(t, n, "the client received bytes")
	require.ErrorIs(t, err, syscall.ECONNRESET, "the connection was closed in order or stayed open")
}

func TestFaultProxy_Resets_ResetBothSidesOfEveryOpenConnectionWithinTheInterval(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	conns := []net.Conn{dial(t, p), dial(t, p)}
	for _, c := range conns {
		exchange(t, srv, c)
	}

	const lo, hi = 100 * time.Millisecond, 200 * time.Millisecond
	start := time.Now()
	require.NoError(t, p.StartResets(lo, hi))
	for _, c := range conns {
		readsReset(t, c)
	}
	took := time.Since(start)
	require.GreaterOrEqual(t, took, lo, "no reset before the shortest interval")
	require.Less(t, took, hi+resetSlack, "reset within the longest interval")
	for range conns {
		require.ErrorIs(t, srv.connectionEndsWith(t), syscall.ECONNRESET, "the server's side was reset too")
	}
	// The counts are updated once the round is over, after the peers heard.
	require.Eventually(t, func() bool {
		got := p.ResetStats()
		return got.Rounds >= 1 && got.Links >= int64(len(conns))
	}, 5*time.Second, time.Millisecond, "counted: %+v", p.ResetStats())
}

func TestFaultProxy_Resets_NewConnectionsAreAcceptedAndResetInTheirTurn(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	const lo, hi = 250 * time.Millisecond, 350 * time.Millisecond
	require.NoError(t, p.StartResets(lo, hi))
	require.Eventually(t, func() bool { return p.ResetStats().Rounds >= 1 }, 5*time.Second, 2*time.Millisecond)

	// Right after a round the next is at least lo away: time enough to show
	// that the proxy still accepts and forwards.
	dialed := time.Now()
	c := dial(t, p)
	exchange(t, srv, c)
	readsReset(t, c)
	require.Less(t, time.Since(dialed), hi+resetSlack)
	require.ErrorIs(t, srv.connectionEndsWith(t), syscall.ECONNRESET)
	require.Eventually(t, func() bool { return p.ResetStats().Rounds >= 2 }, 5*time.Second, time.Millisecond)
}

func TestFaultProxy_StopResets_ConnectionsLiveAfterwards(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	const hi = 50 * time.Millisecond
	require.NoError(t, p.StartResets(20*time.Millisecond, hi))
	require.Eventually(t, func() bool { return p.ResetStats().Rounds >= 2 }, 5*time.Second, 2*time.Millisecond)
	p.StopResets()
	stopped := p.ResetStats()

	c := dial(t, p)
	for range 6 { // six times the longest interval
		exchange(t, srv, c)
		time.Sleep(hi)
	}
	exchange(t, srv, c)
	require.Equal(t, stopped, p.ResetStats(), "no reset after StopResets")
	p.StopResets() // a no-op when off
}

func TestFaultProxy_StartResets_RefusesAnEmptyOrNonPositiveInterval(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	for _, r := range []struct{ lo, hi time.Duration }{
		{0, 100 * time.Millisecond},
		{-time.Millisecond, time.Millisecond},
		{200 * time.Millisecond, 100 * time.Millisecond},
	} {
		require.Error(t, p.StartResets(r.lo, r.hi), "[%v, %v]", r.lo, r.hi)
	}
	require.Equal(t, faultproxy.ResetStats{}, p.ResetStats())
}

func TestFaultProxy_Close_EndsTheResetModeAndRefusesToRestartIt(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p, err := faultproxy.Start(srv.addr())
	require.NoError(t, err)
	require.NoError(t, p.StartResets(10*time.Millisecond, 20*time.Millisecond))
	require.NoError(t, p.StartResets(5*time.Millisecond, 10*time.Millisecond)) // changes the range
	require.NoError(t, p.Close())
	require.Error(t, p.StartResets(10*time.Millisecond, 20*time.Millisecond))
	p.StopResets()
}

// The premise of the reset chaos test: a reset ends go-sql-driver's
// connection with an error, MariaDB rolls the session's open transaction
// back, and the pool reconnects through the proxy once resets stop.
func TestFaultProxy_MariaDB_ResetRollsBackTheOpenTransaction(t *testing.T) {
	t.Parallel()
	direct, dsn := testdb.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := direct.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY)")
	require.NoError(t, err)

	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	p := startProxy(t, cfg.Addr)
	cfg.Addr = p.Addr()
	proxied, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { proxied.Close() })

	tx, err := proxied.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, p.StartResets(20*time.Millisecond, 40*time.Millisecond))
	require.Eventually(t, func() bool { return p.ResetStats().Links >= 1 }, 5*time.Second, 2*time.Millisecond)
	p.StopResets()

	err = tx.Commit()
	require.Error(t, err, "a COMMIT on a reset connection fails")
	require.False(t, errors.Is(err, sql.ErrTxDone), "the COMMIT was sent: %v", err)
	// The server rolled the session back: the same row inserts again.
	_, err = direct.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err, "the reset session's transaction was rolled back")
	require.NoError(t, proxied.PingContext(ctx), "the pool reconnects through the proxy")
}
