package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
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

// serverError is one row of the table by which IsTransient classifies the
// errors a database server sends.
type serverError struct {
	// transient: the failure lies in the server's state (a conflict, a
	// limit, a failover, an operator), not in the request, so the same
	// request may succeed when tried again, on this connection or another.
	transient bool
	// lost: the error reports the end of the session rather than an answer
	// to the statement. As after a dropped connection, whether the last
	// statement (a COMMIT) took effect is unknown.
	lost bool
	why  string
}

// mysqlErrors classifies MySQL's, MariaDB's, Galera's, Group Replication's
// and TiDB's error numbers. A number not listed is not transient: a
// constraint, a bug in the statement, a permission, bad data. Some refusals
// are listed for the record. docs/http.md's "Which database errors are
// transient" is this table.
var mysqlErrors = map[uint16]serverError{
	// A conflict with another transaction: this one was rolled back, and
	// a retry meets the state the winner left.
	1205: {transient: true, why: "lock wait timeout: the statement (with innodb_rollback_on_timeout the transaction) was rolled back"},
	1213: {transient: true, why: "deadlock, or a Galera certification failure or brute-force abort: the transaction was rolled back"},
	1020: {transient: true, why: "MariaDB innodb_snapshot_isolation: the record changed since the transaction read it; rolled back"},
	1412: {transient: true, why: "table definition changed during the transaction: the server asks for a retry"},
	1615: {transient: true, why: "prepared statement needs to be re-prepared (the table changed): a retry prepares it again"},
	1689: {transient: true, why: "lock wait aborted by a pending exclusive lock (DDL)"},
	3572: {transient: true, why: "NOWAIT: a lock was held by another transaction"},
	3100: {transient: true, why: "Group Replication refused the commit (the member is not ONLINE): rolled back"},
	3101: {transient: true, why: "Group Replication certification failure at COMMIT: rolled back"},
	1047: {transient: true, why: "Galera: the node is not part of the primary component (WSREP not ready)"},
	// Cut short by a limit or an operator: nothing of the statement kept.
	1317: {transient: true, why: "query interrupted (KILL QUERY)"},
	3024: {transient: true, why: "MySQL max_execution_time exceeded"},
	1969: {transient: true, why: "MariaDB max_statement_time exceeded"},
	// The server ended the session: the last statement's fate is unknown.
	1927: {transient: true, lost: true, why: "MariaDB: connection killed (KILL)"},
	1053: {transient: true, lost: true, why: "server shutdown in progress"},
	4031: {transient: true, lost: true, why: "disconnected by the server for inactivity (wait_timeout)"},
	3032: {transient: true, lost: true, why: "the server is in offline_mode"},
	1158: {transient: true, lost: true, why: "the server got an error reading from the connection"},
	1159: {transient: true, lost: true, why: "the server timed out reading from the connection"},
	1160: {transient: true, lost: true, why: "the server got an error writing to the connection"},
	1161: {transient: true, lost: true, why: "the server timed out writing to the connection"},
	2006: {transient: true, lost: true, why: "server has gone away (a client code, sent by proxies such as ProxySQL)"},
	2013: {transient: true, lost: true, why: "lost connection during query (a client code, sent by proxies)"},
	// Read-only: a failover in progress (the old primary was demoted, or
	// the connection reached a replica); the next connection may reach
	// the new primary.
	1290: {transient: true, why: "the server runs with --read-only or --super-read-only (1290 also names other options, none of which an order's statements meet)"},
	1836: {transient: true, why: "the server is in read-only mode"},
	1792: {transient: true, why: "a READ ONLY transaction (a proxy or pool routed it to a replica)"},
	// Out of a shared resource that other sessions hold.
	1040: {transient: true, why: "too many connections (max_connections)"},
	1203: {transient: true, why: "the user has too many connections (max_user_connections)"},
	1226: {transient: true, why: "the user exceeded a resource limit (MAX_USER_CONNECTIONS, MAX_QUERIES_PER_HOUR, ...)"},
	1637: {transient: true, why: "too many active concurrent transactions"},
	1037: {transient: true, why: "the server is out of memory"},
	1041: {transient: true, why: "the server is out of memory or another resource"},
	1021: {transient: true, why: "disk full: the server waits for space, or refuses"},
	1129: {transient: true, why: "the host is blocked after connection errors until an operator flushes hosts"},
	// TiDB.
	8002: {transient: true, why: "TiDB: SELECT FOR UPDATE cannot be retried after a write conflict; rolled back"},
	8005: {transient: true, why: "TiDB: write conflict; rolled back"},
	8022: {transient: true, why: "TiDB: commit failed and was rolled back"},
	8027: {transient: true, why: "TiDB: schema changed during the transaction"},
	8028: {transient: true, why: "TiDB: schema changed during the transaction"},
	9001: {transient: true, why: "TiDB: PD server timeout (ProxySQL: could not reach a backend)"},
	9002: {transient: true, why: "TiDB: TiKV server timeout"},
	9003: {transient: true, why: "TiDB: TiKV server busy"},
	9004: {transient: true, why: "TiDB: resolve lock timeout"},
	9005: {transient: true, why: "TiDB: region unavailable"},
	9007: {transient: true, why: "TiDB: write conflict; rolled back"},
	// Refusals of the request itself: a retry meets them again.
	1062: {why: "duplicate key"},
	1451: {why: "a foreign key refuses the delete or update"},
	1452: {why: "a foreign key refuses the insert or update"},
	1406: {why: "data too long for the column"},
	1366: {why: "incorrect value for the column (a string its charset cannot hold)"},
	1045: {why: "access denied"},
	1142: {why: "command denied to the user"},
	1064: {why: "syntax error"},
	1146: {why: "no such table"},
	1180: {why: "error during COMMIT from the storage engine"},
}

// sqlStates classifies SQLSTATE codes, PostgreSQL's through any driver
// whose errors have a SQLState() string method (pgx's *pgconn.PgError,
// lib/pq's *pq.Error): matching the method rather than a driver type keeps
// the drivers out of this module's dependencies. A five-character code's
// row overrides its class's (its first two characters); a code whose class
// is not listed is not transient. docs/http.md's "Which database errors are
// transient" is this table.
var sqlStates = map[string]serverError{
	"08": {transient: true, lost: true, why: "connection exception: the connection failed or was refused"},
	// Class 40, transaction rollback: the server rolled the transaction
	// back whole (serialization failure 40001 under REPEATABLE READ or
	// SERIALIZABLE, or on a hot standby in conflict with recovery;
	// deadlock 40P01; statement completion unknown 40003).
	"40":    {transient: true, why: "transaction rollback: rolled back whole; a retry meets the winner's state"},
	"40002": {why: "integrity constraint violation at COMMIT: a retry meets it again"},
	// Class 53, insufficient resources, shared with other sessions.
	"53":    {transient: true, why: "insufficient resources: disk full (53100), out of memory or shared memory (53200), too many connections (53300)"},
	"53400": {why: "configuration limit exceeded: the request needs more than the server allows"},
	// Class 57, operator intervention.
	"57":    {transient: true, why: "operator intervention: query canceled (57014: statement_timeout, a cancel request), the server starting up (57P03)"},
	"57P01": {transient: true, lost: true, why: "the session was terminated (pg_terminate_backend, a fast shutdown)"},
	"57P02": {transient: true, lost: true, why: "the server crashed and is restarting"},
	"57P05": {transient: true, lost: true, why: "idle_session_timeout ended the session"},
	"57P04": {why: "the database was dropped"},
	// Class 58, system error (outside PostgreSQL).
	"58000": {transient: true, why: "system error"},
	"58030": {transient: true, why: "I/O error"},
	// Single codes of other classes.
	"25006": {transient: true, why: "read-only transaction: a standby, or a primary demoted by a failover; the next connection may reach the new primary"},
	"25P03": {transient: true, why: "idle_in_transaction_session_timeout: the transaction was rolled back and the session ended"},
	"25P04": {transient: true, why: "transaction_timeout (PostgreSQL 17): the transaction was rolled back"},
	"55P03": {transient: true, why: "lock not available (lock_timeout, NOWAIT); in a transaction the error aborts it"},
	"72000": {transient: true, why: "snapshot too old: a retry takes a new snapshot"},
	// Refusals of the request itself, for the record.
	"22":    {why: "data exception (22021: bytes not valid in the encoding; 22001: too long)"},
	"23":    {why: "integrity constraint violation (23505 unique, 23503 foreign key, 23514 check)"},
	"25P02": {why: "in failed SQL transaction: an earlier statement failed, and that error is the one to classify"},
	"28":    {why: "invalid authorization"},
	"3D":    {why: "the database does not exist"},
	"42":    {why: "syntax error or access rule violation"},
}

// serverErrorOf returns the table's row for a server's error, and whether
// err is one: a MySQL error number, or a SQLSTATE. A server error the table
// does not list is a refusal that a retry meets again.
func serverErrorOf(err error) (serverError, bool) {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return mysqlErrors[me.Number], true
	}
	state, ok := sqlState(err)
	if !ok {
		return serverError{}, false
	}
	if row, ok := sqlStates[state]; ok {
		return row, true
	}
	if len(state) == 5 {
		return sqlStates[state[:2]], true
	}
	return serverError{}, true
}

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
// dropped or refused database connection, a server error the tables above
// mark transient (a conflict with another transaction, a limit or an
// operator that cut the work short, a read-only server during a failover,
// a server out of connections, memory or disk), a deadline or cancellation
// (a handler's context ends only when its lease budget runs out), or an
// error wrapping ErrTransient.
//
// Handlers use it to classify their own database errors: answer a transient
// one 503 with Retry-After (the middleware rolls the transaction back and
// releases the key, so the retry executes afresh), anything else 500.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if row, ok := serverErrorOf(err); ok {
		return row.transient
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

// answered reports an error that is the server's answer to the statement:
// the statement, and a COMMIT that fails so, did not take effect. A
// dropped connection, or a server's report that it ended the session, is
// no such answer: the server may have executed the statement before it
// went away.
func answered(err error) bool {
	row, ok := serverErrorOf(err)
	return ok && !row.lost
}

// replyLost reports an error after which a statement's fate is unknown: no
// server's answer came (the connection failed, the deadline passed, or the
// server ended the session), and the failure is one a retry may overcome.
// A server's answer, whatever it says, proves the statement did not apply.
func replyLost(err error) bool {
	return !answered(err) && IsTransient(err)
}

// mayHaveLanded reports a failure after which a statement's effect is
// unknown: the connection failed with no answer from the server, which may
// have executed the statement before it went away.
func mayHaveLanded(err error) bool {
	return IsTransient(err) && !answered(err)
}
