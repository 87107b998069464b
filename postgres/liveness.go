package postgres

import (
	"context"
	"database/sql/driver"
	"net"
	"time"
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
	if c.Conn.Conn().IsClosed() { // by pgx: the network, the server or the statement's context ended it
		c.reportIfEndedByPeer()
		return driver.ErrBadConn
	}
	switch peek(socket(c.Conn.Conn().PgConn().Conn())) {
	case peerGone:
		c.reportDeath()
		return driver.ErrBadConn
	case peerSent:
		if err := c.Conn.Conn().PgConn().Ping(ctx); err != nil {
			c.reportDeath()
			return driver.ErrBadConn
		}
	}
	return c.Conn.ResetSession(ctx)
}

// IsValid runs when database/sql puts a connection back in the pool: one
// pgx closed (it broke, or its statement's context ended) is discarded now
// rather than at its next checkout, and Close reports it.
func (c *conn) IsValid() bool { return !c.Conn.Conn().IsClosed() }

// Close reports a connection that broke in use.
func (c *conn) Close() error {
	if c.Conn.Conn().IsClosed() {
		c.reportIfEndedByPeer()
	}
	return c.Conn.Close()
}

// reportIfEndedByPeer reports c, which pgx closed, if the network or the
// server ended it rather than pgx for a statement whose context ended.
func (c *conn) reportIfEndedByPeer() {
	if w := watchedSocket(c.Conn.Conn().PgConn().Conn()); w != nil && w.verdict.Load() == endedByPeer {
		c.reportDeath()
	}
}

// reportDeath tells Open's pool that c died (adaptive.died).
func (c *conn) reportDeath() {
	if w := watchedSocket(c.Conn.Conn().PgConn().Conn()); c.pool != nil && w != nil {
		c.pool.died(c.born, time.Unix(0, w.lastIO.Load()))
	}
}

// socket is the connection under TLS, if any.
func socket(c net.Conn) net.Conn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		return t.NetConn()
	}
	return c
}
