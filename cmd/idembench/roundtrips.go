package main

// Round trips to the database, counted in this process: on MariaDB at the
// network connection, on PostgreSQL by pgx's tracer (postgres.go).

import (
	"context"
	"database/sql/driver"
	"net"
	"sync/atomic"
	"syscall"
)

// sqlCounts counts what this process sends to the database. Unlike the
// server's global counters it sees only this benchmark's traffic.
type sqlCounts struct {
	trips, commits atomic.Int64
}

func (c *sqlCounts) snapshot() map[string]float64 {
	return map[string]float64{
		"round_trips": float64(c.trips.Load()),
		"commits":     float64(c.commits.Load()),
	}
}

// countedConnector counts the round trips of its connections in n once they
// are open: the handshake and the session's settings are no request's. Its
// Driver is the wrapped connector's, by which NewMySQLStore recognises
// idempotency.OpenMySQL's pool. The connections must be dialled by
// dialCounted (mysql.Config.DialFunc).
type countedConnector struct {
	driver.Connector
	n *sqlCounts
}

// dialedKey holds, in Connect's context, where dialCounted leaves the
// connection it dialled.
type dialedKey struct{}

func (c countedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var nc *countedNetConn
	conn, err := c.Connector.Connect(context.WithValue(ctx, dialedKey{}, &nc))
	if err == nil && nc != nil {
		nc.n.Store(c.n)
	}
	return conn, err
}

// dialCounted dials as go-sql-driver/mysql does and wraps the connection
// for countedConnector.
func dialCounted(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	nc := &countedNetConn{Conn: conn}
	if slot, ok := ctx.Value(dialedKey{}).(**countedNetConn); ok {
		*slot = nc
	}
	return nc, nil
}

// countedNetConn counts one round trip for each write that follows a read
// (or is the first once counting starts): a statement, BEGIN or COMMIT is
// one, and so is a batch of statements sent together, such as single-phase's
// record INSERT sent with the COMMIT on idempotency.OpenMySQL's pool.
type countedNetConn struct {
	net.Conn
	n        atomic.Pointer[sqlCounts] // nil until the connection is open
	answered atomic.Bool               // a read since the last counted write
}

func (c *countedNetConn) Write(b []byte) (int, error) {
	if n := c.n.Load(); n != nil && c.answered.Swap(false) {
		n.trips.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *countedNetConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.answered.Store(true)
	}
	return n, err
}

// SyscallConn lets the driver check an idle connection's liveness, as it
// does on a plain TCP connection.
func (c *countedNetConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}
