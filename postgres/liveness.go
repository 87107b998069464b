package postgres

import (
	"context"
	"database/sql/driver"
	"net"
)

// peerState is what a pooled connection's socket says without a round
// trip: whether the server has ended the session since the connection was
// last used.
type peerState int

const (
	peerUnknown peerState = iota // the socket cannot be inspected (peek unsupported)
	peerQuiet                    // open, nothing to read: the usual idle connection
	peerSent                     // the server sent something unasked
	peerGone                     // reset or closed by the peer
)

// ResetSession runs before database/sql hands a pooled connection out again.
// A connection the network or the server has ended since its last use is
// refused here, so that database/sql takes another or opens a new one, as
// go-sql-driver/mysql does with its liveness check; pgx alone pings only a
// connection idle for over a second, and otherwise the statement sent on a
// dead connection fails the request. Without a round trip: the socket is
// peeked, which costs one system call. When the server has sent something
// unasked (most often the FATAL error with which it ends a session:
// pg_terminate_backend, a shutdown, idle_session_timeout), a ping lets pgx
// read it.
//
// A connection found dead here is reported to Open's pool (adaptive).
func (c *conn) ResetSession(ctx context.Context) error {
	if c.Conn.Conn().IsClosed() { // by pgx: the network or the statement's context ended it
		c.reportIfEnded()
		return driver.ErrBadConn
	}
	switch peek(socket(c.Conn.Conn().PgConn().Conn())) {
	case peerGone:
		c.pool.died(c.born)
		return driver.ErrBadConn
	case peerSent:
		if err := c.Conn.Conn().PgConn().Ping(ctx); err != nil {
			c.pool.died(c.born)
			return driver.ErrBadConn
		}
	}
	return c.Conn.ResetSession(ctx)
}

// Close reports a connection that broke in use, when database/sql closes
// it without taking it from the pool again.
func (c *conn) Close() error {
	c.reportIfEnded()
	return c.Conn.Close()
}

// reportIfEnded reports c to Open's pool if pgx closed it because the
// network or the server ended it while a statement was using it.
func (c *conn) reportIfEnded() {
	if c.pool != nil && c.Conn.Conn().IsClosed() && endedByPeer(c.Conn.Conn().PgConn().Conn()) {
		c.pool.died(c.born)
	}
}

// socket is the connection under TLS, if any.
func socket(c net.Conn) net.Conn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		return t.NetConn()
	}
	return c
}
