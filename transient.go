package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
)

// ErrTransient marks a failure of the infrastructure or a lost race that a
// retry with the same key can overcome: the database was unreachable, the
// connection dropped, or the transaction was rolled back by the server
// (deadlock, lock wait timeout, a cluster's certification conflict). Wrap it
// (fmt.Errorf("...: %w", idempotency.ErrTransient)) to mark an error of your
// own; IsTransient recognises it.
var ErrTransient = errors.New("idempotency: transient failure; retry with the same key")

// Server error numbers that mean "this statement or transaction did not take
// effect, and the same work may succeed if tried again". Each engine reports
// its conflicts differently:
//
//	MySQL, MariaDB   1205 lock wait timeout (the statement was rolled back)
//	                 1213 deadlock (the transaction was rolled back)
//	MariaDB          1020 record changed since last read, under
//	                 innodb_snapshot_isolation (the transaction was rolled back)
//	Galera (MariaDB  1213 certification failure, at COMMIT or on the next
//	Galera, PXC)     statement after a brute-force abort
//	                 1047 WSREP has not yet prepared node for application use
//	                 (the node is not part of the primary component)
//	Group            3101 plugin instructed the server to roll back the
//	Replication      transaction (certification failure at COMMIT)
//	TiDB             8002 SELECT FOR UPDATE transaction cannot be retried
//	                 after a write conflict; 8005 and 9007 write conflict;
//	                 8022 transaction commit failed and was rolled back;
//	                 8027, 8028 schema changed during the transaction;
//	                 9001, 9002 PD or TiKV server timeout; 9003 TiKV busy;
//	                 9004 resolve lock timeout; 9005 region unavailable
//	any              1040 too many connections; 1053 server shutdown in
//	                 progress; 1927 connection killed; 4031 disconnected by
//	                 the server for inactivity
//
// PostgreSQL reports SQLSTATE codes instead (see transientSQLStates).
var transientServerErrors = map[uint16]bool{
	1020: true, 1040: true, 1047: true, 1053: true, 1205: true, 1213: true,
	1927: true, 3101: true, 4031: true,
	8002: true, 8005: true, 8022: true, 8027: true, 8028: true,
	9001: true, 9002: true, 9003: true, 9004: true, 9005: true, 9007: true,
}

// transientSQLStates are the SQLSTATE codes (PostgreSQL's, through any
// driver whose errors have a SQLState() string method, as pgx's
// *pgconn.PgError and lib/pq's *pq.Error do) after which the same work may
// succeed if tried again. Matching the method rather than a driver type keeps
// the drivers out of this module's dependencies.
//
//	40001  serialization failure (REPEATABLE READ, SERIALIZABLE): the
//	       transaction was rolled back
//	40P01  deadlock detected: the transaction was rolled back
//	55P03  lock not available (lock_timeout, NOWAIT): the statement failed,
//	       and in a transaction an error aborts the whole transaction
//	57014  query canceled (statement_timeout)
//	08xxx  connection exceptions; 53300 too many connections; 57P01,
//	       57P02, 57P03 the server is shutting down or starting up
var transientSQLStates = map[string]bool{
	"40001": true, "40P01": true, "55P03": true, "57014": true,
	"53300": true, "57P01": true, "57P02": true, "57P03": true,
}

// rollbackSQLStates are the transient SQLSTATE codes after which the whole
// transaction is known to be rolled back.
var rollbackSQLStates = map[string]bool{"40001": true, "40P01": true}

// sqlState returns the SQLSTATE of a server error, if err carries one.
func sqlState(err error) (string, bool) {
	var se interface{ SQLState() string }
	if !errors.As(err, &se) {
		return "", false
	}
	return se.SQLState(), true
}

// IsTransient reports whether err is a failure that a retry of the same
// request can overcome, as opposed to a bug or a permanent refusal: a
// dropped or refused database connection, a server error from the lists
// above (deadlock, lock wait timeout, snapshot or serialization conflict, a
// cluster's certification conflict), a deadline or cancellation (a handler's
// context ends only when its lease budget runs out), or an error wrapping
// ErrTransient.
//
// Handlers use it to classify their own database errors: answer a transient
// one 503 with Retry-After (the middleware rolls the transaction back and
// releases the key, so the retry executes afresh), anything else 500.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return transientServerErrors[me.Number]
	}
	if state, ok := sqlState(err); ok {
		return transientSQLStates[state] || strings.HasPrefix(state, "08")
	}
	var ne net.Error
	switch {
	case errors.Is(err, ErrTransient),
		errors.Is(err, driver.ErrBadConn),
		errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded),
		// A handler's context is detached from the client's: it ends only
		// when the attempt's lease budget runs out (a stalled database, a
		// cluster waiting out a dead node).
		errors.Is(err, context.Canceled),
		errors.As(err, &ne):
		return true
	}
	return false
}

// replyLost reports an error after which a statement's fate is unknown: the
// connection failed (or the deadline passed) without a server's answer. A
// server's error, whatever it says, proves the statement did not apply.
func replyLost(err error) bool {
	var me *mysql.MySQLError
	if _, ok := sqlState(err); ok || errors.As(err, &me) {
		return false
	}
	return IsTransient(err)
}

// isRollback reports a server's answer that the transaction was rolled back
// as a whole (a deadlock, a snapshot or certification conflict): unlike a
// dropped connection, it leaves no doubt that nothing committed.
func isRollback(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return rollbackServerErrors[me.Number]
	}
	state, ok := sqlState(err)
	return ok && rollbackSQLStates[state]
}

// rollbackServerErrors are the transient server errors after which the
// whole transaction is known to be rolled back.
var rollbackServerErrors = map[uint16]bool{
	1020: true, 1047: true, 1213: true, 3101: true,
	8002: true, 8005: true, 8022: true, 9007: true,
}

// mayHaveLanded reports a failure after which a statement's effect is
// unknown: the connection failed with no answer from the server, which may
// have executed the statement before it went away.
func mayHaveLanded(err error) bool {
	var me *mysql.MySQLError
	_, answered := sqlState(err)
	return IsTransient(err) && !errors.As(err, &me) && !answered
}
