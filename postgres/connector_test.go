package postgres_test

// The specifications of the pools' connection attempts and pooled
// connections (NewConnector, and so OpenDB and Open), against the real
// server: a server out of slots is waited for, a connection attempt the
// network cut is made again, a pooled connection the server ended is never
// handed out, and Open's pool leaves a default server room for three
// instances.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// dials counts the connection attempts of a config (one dial each, for a
// single host) and runs before, if set, ahead of attempt n.
type dials struct {
	n      atomic.Int64
	before func(n int64)
}

func (d *dials) on(cfg *pgx.ConnConfig) {
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n := d.n.Add(1)
		if d.before != nil {
			d.before(n)
		}
		return dial(ctx, network, addr)
	}
}

// limitedRole is a role that may hold one connection at a time (CONNECTION
// LIMIT 1) and a config connecting as it: the server refuses its second
// connection with 53300, as it refuses any once max_connections is reached.
func limitedRole(t *testing.T) *pgx.ConnConfig {
	t.Helper()
	admin, dsn := pgtest.Postgres(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "idem_slot_" + hex.EncodeToString(b[:])
	_, err := admin.Exec("CREATE ROLE " + role + " LOGIN CONNECTION LIMIT 1")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec("DROP ROLE IF EXISTS " + role) })
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.User = role
	return cfg
}

// holdSlot takes the role's one slot and returns a function that gives it
// back.
func holdSlot(t *testing.T, cfg *pgx.ConnConfig) (release func()) {
	t.Helper()
	holder, err := pgx.ConnectConfig(context.Background(), cfg.Copy())
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = holder.Close(context.Background()) }) }
	t.Cleanup(release)
	return release
}

func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "want SQLSTATE %s", code)
	require.Equal(t, code, pe.Code)
}

func TestConnector_ServerOutOfSlots_WaitsForASlotAndConnects(t *testing.T) {
	t.Parallel()
	cfg := limitedRole(t)
	release := holdSlot(t, cfg)

	var d dials
	d.before = func(n int64) {
		if n == 2 { // the first attempt was refused: the slot frees up now
			release()
		}
	}
	d.on(cfg)
	db := sql.OpenDB(postgres.NewConnector(*cfg))
	defer db.Close()

	require.NoError(t, db.PingContext(context.Background()),
		"a connection refused for want of a slot (53300) waits for one instead of failing the request")
	require.GreaterOrEqual(t, d.n.Load(), int64(2), "the first attempt was refused, a later one connected")
}

func TestConnector_NoSlotFreesUpWithinSlotWait_FailsWithTheRetryable53300(t *testing.T) {
	t.Parallel()
	cfg := limitedRole(t)
	holdSlot(t, cfg)
	var d dials
	d.on(cfg)
	db := sql.OpenDB(postgres.NewConnector(*cfg))
	defer db.Close()

	start := time.Now()
	err := db.PingContext(context.Background())
	waited := time.Since(start)
	requireSQLState(t, err, "53300")
	require.True(t, idempotency.IsTransient(err), "too many connections is retryable: the middleware answers 503 with Retry-After")
	require.GreaterOrEqual(t, waited, postgres.SlotWait, "it waited SlotWait for a slot before giving up")
	require.Greater(t, d.n.Load(), int64(1), "it tried again while it waited")
}

func TestConnector_TheRequestsDeadline_BoundsTheWaitForASlot(t *testing.T) {
	t.Parallel()
	cfg := limitedRole(t)
	holdSlot(t, cfg)
	db := sql.OpenDB(postgres.NewConnector(*cfg))
	defer db.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := db.PingContext(ctx)
	require.Error(t, err)
	require.Less(t, time.Since(start), postgres.SlotWait, "a request whose deadline comes first stops waiting then")
}

func TestConnector_OtherConnectErrors_ReturnAtOnce(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.Database = "pg_no_such_database"
	var d dials
	d.on(cfg)
	db := sql.OpenDB(postgres.NewConnector(*cfg))
	defer db.Close()

	requireSQLState(t, db.PingContext(context.Background()), "3D000")
	require.Equal(t, int64(1), d.n.Load(), "a connection refused for any reason but a slot is not tried again")
}

// resetFirst is a listener whose first connection is reset (TCP RST) as
// soon as the client has sent its first bytes, the startup message: a
// connection attempt cut before the session is ready.
func resetFirst(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Read(make([]byte, 512))
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}()
	return ln.Addr().String()
}

func TestConnector_AttemptCutBeforeTheSession_IsMadeAgain(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cut := resetFirst(t)
	var n atomic.Int64
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		// A connection attempt dials the server; pgx's cancel request
		// after the cut dials the address it was cut on.
		if addr != cut && n.Add(1) == 1 {
			addr = cut
		}
		return dial(ctx, network, addr)
	}
	db := sql.OpenDB(postgres.NewConnector(*cfg))
	defer db.Close()

	require.NoError(t, db.PingContext(context.Background()),
		"nothing ran on a connection cut during its startup: the attempt is made again")
	require.Equal(t, int64(2), n.Load(), "the cut attempt and the one that connected")
}

// A pooled connection that the server ended while it was idle (here
// pg_terminate_backend; a restart, idle_session_timeout or a proxy's reset
// do the same) is never handed out again: database/sql gets another
// connection, and the statement succeeds. pgx alone pings a pooled
// connection only after a second of idleness, and the statement sent on
// the dead one fails.
func TestOpenDB_PooledConnectionTheServerEnded_IsNotHandedOut(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	db := postgres.OpenDB(*cfg)
	defer db.Close()
	db.SetMaxOpenConns(1)

	ctx := context.Background()
	var pid int
	for range 2 { // pgx pings a pooled connection on its first reuse, whatever its idleness
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	}
	var ended bool
	require.NoError(t, admin.QueryRowContext(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended))
	require.True(t, ended, "the backend exited")

	var again int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&again),
		"the query runs on a new connection, not on the ended one")
	require.NotEqual(t, pid, again)
}

// Open's pool leaves a default server (max_connections 100, 3 of them
// reserved for superusers) room for three instances of a service and
// 20 connections besides: migrations, idemctl, monitoring, and the
// backends of an instance that just died, which linger for a moment.
func TestOpen_PoolLeavesADefaultServerRoomForThreeInstances(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	db, err := postgres.Open(dsn)
	require.NoError(t, err)
	defer db.Close()
	require.Equal(t, postgres.MaxConns, db.Stats().MaxOpenConnections)
	const defaultSlots, besides = 100 - 3, 20
	require.LessOrEqual(t, 3*postgres.MaxConns+besides, defaultSlots,
		"three pools of MaxConns and %d more connections fit a default server's %d slots", besides, defaultSlots)
}

// cutProxy forwards connections to a server and cuts them all with a TCP
// RST on both sides on demand, as a flapping network or a load balancer
// does.
type cutProxy struct {
	addr string

	mu    sync.Mutex
	conns []*net.TCPConn
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	p := &cutProxy{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c.(*net.TCPConn), s.(*net.TCPConn))
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c) }()
			go func() { _, _ = io.Copy(c, s) }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	p.conns = nil
}

// cutPool is an OpenDB pool of one connection through a cutProxy.
func cutPool(t *testing.T) (*sql.DB, *cutProxy) {
	t.Helper()
	_, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	p := startCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, err := net.SplitHostPort(p.addr)
	require.NoError(t, err)
	cfg.Host = host
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.Port = uint16(n)
	db := postgres.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db, p
}

// onPooledConn runs f on the pool's connection as the driver sees it.
func onPooledConn(t *testing.T, db *sql.DB, f func(dc driver.Conn, nc net.Conn) error) {
	t.Helper()
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer c.Close()
	err = c.Raw(func(dc any) error { return f(dc.(driver.Conn), postgres.NetConn(dc)) })
	if !errors.Is(err, driver.ErrBadConn) { // f's way to have it discarded
		require.NoError(t, err)
	}
}

// cutAndWait cuts the proxy's connections and waits until the client's
// socket has seen the reset.
func cutAndWait(t *testing.T, p *cutProxy, nc net.Conn) {
	t.Helper()
	p.cut()
	require.Eventually(t, func() bool { return postgres.PeekState(nc) == "gone" }, 10*time.Second, time.Millisecond,
		"the client's socket sees the reset")
}

// A pooled connection the network reset while it sat idle is refused when
// database/sql takes it out again (ResetSession), without a round trip, so
// that it takes another: the reset is in the socket, and a peek finds it.
func TestOpenDB_PooledConnectionTheNetworkReset_IsRefusedAtCheckout(t *testing.T) {
	t.Parallel()
	db, p := cutPool(t)
	ctx := context.Background()
	onPooledConn(t, db, func(dc driver.Conn, nc net.Conn) error {
		resetter := dc.(driver.SessionResetter)
		require.NoError(t, resetter.ResetSession(ctx), "a live connection is handed out")
		cutAndWait(t, p, nc)
		require.ErrorIs(t, resetter.ResetSession(ctx), driver.ErrBadConn,
			"a connection the network reset is refused at checkout")
		return driver.ErrBadConn // discard it
	})
	var one int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT 1").Scan(&one), "a new connection serves the next query")
}

// A query that never reached the server, sent on a connection the network
// has reset, is driver.ErrBadConn, so that database/sql runs it on another
// connection, as pgx's own ExecContext has it for a statement.
func TestOpenDB_QueryThatNeverReachedTheServer_IsErrBadConn(t *testing.T) {
	t.Parallel()
	db, p := cutPool(t)
	ctx := context.Background()
	onPooledConn(t, db, func(dc driver.Conn, nc net.Conn) error {
		q := dc.(driver.QueryerContext)
		// Once prepared on the connection, a query is one write: pgx meets
		// its failure only when it reads the first row.
		rows, err := q.QueryContext(ctx, "SELECT 1", nil)
		require.NoError(t, err)
		require.NoError(t, rows.Close())
		cutAndWait(t, p, nc)
		_, err = q.QueryContext(ctx, "SELECT 1", nil)
		require.ErrorIs(t, err, driver.ErrBadConn, "got %v", err)
		return driver.ErrBadConn
	})
	var one int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT 1").Scan(&one), "a new connection serves the next query")
}
