package postgres

import (
	"database/sql"
	"net"
	"time"
)

// PeekState is what ResetSession's peek sees on c: "quiet", "sent", "gone"
// or "unknown".
func PeekState(c net.Conn) string {
	return [...]string{peerUnknown: "unknown", peerQuiet: "quiet", peerSent: "sent", peerGone: "gone"}[peek(socket(c))]
}

// NetConn is the socket of a driver connection from OpenDB's pool (as
// sql.Conn.Raw hands it out).
func NetConn(driverConn any) net.Conn { return driverConn.(*conn).Conn.Conn().PgConn().Conn() }

// OpenWithGrowth is Open whose pool grows its limit back by one each time
// grow is sent on, instead of every growEvery.
func OpenWithGrowth(dsn string, grow <-chan time.Time) (*sql.DB, error) {
	pool := newAdaptive()
	pool.after = func(time.Duration) <-chan time.Time { return grow }
	return open(dsn, pool)
}
