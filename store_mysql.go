package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency/migrations"
)

// MySQL server error numbers the store translates. IsTransient lists every
// number the package treats as a retryable fault, engine by engine.
const (
	mysqlErrDupEntry                 = 1062
	mysqlErrLockDeadlock             = 1213 // also Galera's certification failure
	mysqlErrLockWaitTimeout          = 1205
	mysqlErrWsrepNotReady            = 1047 // Galera node outside the primary component
	mysqlErrGroupReplicationRollback = 3101
	mysqlErrUnknownSystemVariable    = 1193
)

// MySQLDialect is the SQL of MySQL 8 and MariaDB 10.6+. It uses only
// DATETIME(6), NOW(6) and INTERVAL arithmetic that both accept.
var MySQLDialect = Dialect{
	Name: "mysql",
	Claim: `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, created_at, updated_at, expires_at)
VALUES (?, ?, ?, 'PROCESSING', ?, 1,
   NOW(6) + INTERVAL ? MICROSECOND, NOW(6), NOW(6), NOW(6) + INTERVAL ? MICROSECOND)`,
	Lookup: `SELECT request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at,
  locked_until IS NULL OR locked_until <= NOW(6),
  status <> 'PROCESSING' AND expires_at <= NOW(6), NOW(6)
FROM idempotency_record WHERE scope = ? AND idempotency_key = ?`,
	// MySQL evaluates single-table SET assignments left to right, so
	// created_at is computed from the old expires_at before it changes.
	TakeOver: `UPDATE idempotency_record SET
  created_at = IF(status <> 'PROCESSING', NOW(6), created_at),
  request_fingerprint = ?, status = 'PROCESSING', locked_by = ?,
  lease_version = lease_version + 1,
  locked_until = NOW(6) + INTERVAL ? MICROSECOND,
  response_status = NULL, response_headers = NULL, response_body = NULL,
  updated_at = NOW(6), expires_at = NOW(6) + INTERVAL ? MICROSECOND
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND (IF(status = 'PROCESSING', locked_until, expires_at) <= NOW(6))`,
	Finish: `UPDATE idempotency_record SET
  status = ?, response_status = ?, response_headers = ?, response_body = ?,
  lease_version = lease_version + 1, locked_until = NULL,
  updated_at = NOW(6), expires_at = NOW(6) + INTERVAL ? MICROSECOND
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	Release: `DELETE FROM idempotency_record
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	Extend: `UPDATE idempotency_record SET
  locked_until = NOW(6) + INTERVAL ? MICROSECOND, lease_version = lease_version + 1,
  updated_at = NOW(6)
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	ExpiredLeases: `SELECT scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at, 1, 0, NOW(6)
FROM idempotency_record
WHERE status = 'PROCESSING' AND locked_until <= NOW(6)
ORDER BY locked_until LIMIT ?`,
	InsertFinal: `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, response_status, response_headers, response_body,
   created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, 1, NULL, ?, ?, ?, NOW(6), NOW(6), NOW(6) + INTERVAL ? MICROSECOND)`,
	// Ordered like the (status, expires_at) index, so each batch is a short
	// range scan per final status with no sort; PROCESSING records are left
	// alone, their fate is the lease's.
	Purge: `DELETE FROM idempotency_record
WHERE status IN ('DONE', 'FAILED') AND expires_at <= NOW(6)
ORDER BY status, expires_at LIMIT ?`,
	CountByStatus: `SELECT status, COUNT(*) FROM idempotency_record GROUP BY status`,
	Health: `SELECT
  (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)) FROM idempotency_record WHERE status = 'PROCESSING'),
  (SELECT COUNT(*) FROM idempotency_record WHERE status = 'PROCESSING' AND locked_until <= NOW(6)),
  (SELECT COUNT(*) FROM idempotency_record WHERE expires_at <= NOW(6) AND status IN ('DONE', 'FAILED'))`,
	TableBytes: `SELECT data_length + index_length FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'idempotency_record'`,
	// There is no index on created_at (every insert would pay for it); the
	// store runs this operator statement under READ COMMITTED, so the scan
	// locks only the rows it deletes and claims are not blocked.
	PurgeOlderThan: `DELETE FROM idempotency_record
WHERE created_at <= NOW(6) - INTERVAL ? MICROSECOND AND status IN ('DONE', 'FAILED')
LIMIT ?`,
	IsDuplicate: func(err error) bool { return mysqlErrorIs(err, mysqlErrDupEntry) },
	// A statement in autocommit that the server refused whole: safe to run
	// again. (1020 cannot happen in autocommit; see Adapt.)
	IsTransient: func(err error) bool {
		return mysqlErrorIs(err, mysqlErrLockDeadlock) || mysqlErrorIs(err, mysqlErrLockWaitTimeout) ||
			mysqlErrorIs(err, mysqlErrWsrepNotReady) || mysqlErrorIs(err, mysqlErrGroupReplicationRollback)
	},
	Adapt: adaptMySQL,
}

// adaptMySQL tailors the statements to MariaDB where it differs from MySQL.
//
// Snapshot isolation. With innodb_snapshot_isolation ON (the default since
// MariaDB 11.6.2, a session variable on 10.6.18+/10.11.8+), a REPEATABLE
// READ transaction that writes a row changed after its read view was made
// fails with 1020 and is rolled back whole. The business transaction's read
// view is made by the handler's first read, and the record changes after it
// by design: a heartbeat (ExtendLease) bumps its lease_version, and in
// single-phase a concurrent duplicate's committed record is what the INSERT
// must meet. So the two record statements of the business transaction run
// with the check off for that statement alone (SET STATEMENT … FOR): they
// read the latest committed row, which is what fencing by owner and version
// needs, and the handler's own statements keep the isolation it chose.
//
// Galera. A node applies other nodes' write sets asynchronously, so a read
// right after a duplicate-key error or a certification conflict may not yet
// see the winner's record. With wsrep_on, Lookup waits for the node to
// catch up (wsrep_sync_wait=1 for that statement): the reads that must see
// a committed winner are exactly the lookups.
func adaptMySQL(ctx context.Context, db *sql.DB, d Dialect) (Dialect, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return d, err
	}
	if !strings.Contains(version, "MariaDB") {
		return d, nil // MySQL has neither SET STATEMENT nor snapshot isolation
	}
	snapshotIsolation, err := mysqlVariableExists(ctx, db, "innodb_snapshot_isolation")
	if err != nil {
		return d, err
	}
	var wsrepOn sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT @@wsrep_on").Scan(&wsrepOn); err != nil && !mysqlErrorIs(err, mysqlErrUnknownSystemVariable) {
		return d, err
	}
	if snapshotIsolation {
		const off = "SET STATEMENT innodb_snapshot_isolation=OFF FOR "
		d.FinishInTx, d.InsertFinalInTx = off+d.Finish, off+d.InsertFinal
	}
	if wsrepOn.String == "1" || strings.EqualFold(wsrepOn.String, "ON") {
		d.Lookup = "SET STATEMENT wsrep_sync_wait=1 FOR " + d.Lookup
	}
	return d, nil
}

func mysqlVariableExists(ctx context.Context, db *sql.DB, name string) (bool, error) {
	var v sql.NullString
	err := db.QueryRowContext(ctx, "SELECT @@"+name).Scan(&v)
	switch {
	case err == nil:
		return true, nil
	case mysqlErrorIs(err, mysqlErrUnknownSystemVariable):
		return false, nil
	}
	return false, err
}

func mysqlErrorIs(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}

// NewMySQLStore returns the Store for MySQL 8 and MariaDB 10.6+.
//
// Open db with interpolateParams=true: every statement here is a single
// round trip then, instead of prepare, execute and close. parseTime is
// optional; the store reads times either way. On a db from OpenMySQL
// single-phase's record INSERT travels with the COMMIT.
func NewMySQLStore(db *sql.DB) *SQLStore {
	s := NewSQLStore(db, MySQLDialect)
	s.withCommit = sendsWithCommit(db)
	return s
}

// Migrate applies the MySQL schema (idempotency_record and the reference
// purchase_order table) and records applied versions in schema_migrations.
// It is safe to call on every start.
func Migrate(ctx context.Context, db *sql.DB) error {
	return migrations.Apply(ctx, db, "mysql")
}
