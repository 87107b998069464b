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

// OpenWithGrowth is Open whose pool grows its limit back each time grow is
// sent on, instead of every growEvery; deaths reports how many connection
// deaths have counted (halved the limit, or would have at 2).
func OpenWithGrowth(dsn string, grow <-chan time.Time) (db *sql.DB, deaths func() int, err error) {
	pool := newAdaptive()
	pool.after = func(time.Duration) <-chan time.Time { return grow }
	db, err = open(dsn, pool)
	return db, func() int {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return pool.counted
	}, err
}

// CleanupDone is closed once pgx has finished closing a driver connection
// from Open's or OpenDB's pool (as sql.Conn.Raw hands it out).
func CleanupDone(driverConn any) <-chan struct{} {
	return driverConn.(*conn).Conn.Conn().PgConn().CleanupDone()
}
