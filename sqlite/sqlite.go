package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	msqlite "modernc.org/sqlite"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
)

// SQLite result codes the Dialect classifies. The driver enables extended
// result codes, so constraint violations arrive with their extended code and
// busy/locked errors may carry one in the high byte.
const (
	sqliteBusy                 = 5
	sqliteLocked               = 6
	sqliteConstraintPrimaryKey = 1555
	sqliteConstraintUnique     = 2067
)

// now is the current time as integer Unix microseconds by SQLite's clock.
// SQLite keeps time in whole milliseconds and returns the same 'now' for the
// whole statement, so created_at and updated_at of one row agree exactly.
// Rounding the milliseconds before scaling keeps float error out of the
// stored integers.
const now = `(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`

// Dialect is the SQL of SQLite 3.42+ (for unixepoch's subsec modifier;
// modernc.org/sqlite v1.62.0 bundles 3.54.1). Its statements take the
// parameters of idempotency.MySQLDialect in the same order and have the same
// semantics; times are INTEGER Unix microseconds.
var Dialect = idempotency.Dialect{
	Name: "sqlite",
	Claim: `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, created_at, updated_at, expires_at)
VALUES (?, ?, ?, 'PROCESSING', ?, 1,
   ` + now + ` + ?, ` + now + `, ` + now + `, ` + now + ` + ?)`,
	Lookup: `SELECT request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at,
  locked_until IS NULL OR locked_until <= ` + now + `,
  status <> 'PROCESSING' AND expires_at <= ` + now + `, ` + now + `
FROM idempotency_record WHERE scope = ? AND idempotency_key = ?`,
	// SQLite evaluates every SET expression against the old row, so
	// created_at sees the old expires_at wherever it stands in the list: a
	// takeover after retention starts a new record's life, one after a lost
	// lease keeps the original creation time.
	TakeOver: `UPDATE idempotency_record SET
  created_at = CASE WHEN status <> 'PROCESSING' THEN ` + now + ` ELSE created_at END,
  request_fingerprint = ?, status = 'PROCESSING', locked_by = ?,
  lease_version = lease_version + 1,
  locked_until = ` + now + ` + ?,
  response_status = NULL, response_headers = NULL, response_body = NULL,
  updated_at = ` + now + `, expires_at = ` + now + ` + ?
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND (CASE WHEN status = 'PROCESSING' THEN locked_until ELSE expires_at END) <= ` + now + ``,
	Finish: `UPDATE idempotency_record SET
  status = ?, response_status = ?, response_headers = ?, response_body = ?,
  lease_version = lease_version + 1, locked_until = NULL,
  updated_at = ` + now + `, expires_at = ` + now + ` + ?
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	Release: `DELETE FROM idempotency_record
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	Extend: `UPDATE idempotency_record SET
  locked_until = ` + now + ` + ?, lease_version = lease_version + 1,
  updated_at = ` + now + `
WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND lease_version = ?
  AND status = 'PROCESSING'`,
	ExpiredLeases: `SELECT scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at, 1, 0, ` + now + `
FROM idempotency_record
WHERE status = 'PROCESSING' AND locked_until <= ` + now + `
ORDER BY locked_until LIMIT ?`,
	InsertFinal: `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, response_status, response_headers, response_body,
   created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, 1, NULL, ?, ?, ?, ` + now + `, ` + now + `, ` + now + ` + ?)`,
	// SQLite builds without DELETE ... LIMIT by default, so a subquery picks
	// the batch; the table has no rowid, its primary key names the rows. The
	// order is the (status, expires_at) index's, so the batch is a short
	// range scan per final status with no sort.
	Purge: `DELETE FROM idempotency_record
WHERE (scope, idempotency_key) IN (
  SELECT scope, idempotency_key FROM idempotency_record
  WHERE status IN ('DONE', 'FAILED') AND expires_at <= ` + now + `
  ORDER BY status, expires_at LIMIT ?)`,
	CountByStatus: `SELECT status, COUNT(*) FROM idempotency_record GROUP BY status`,
	Health: `SELECT
  (SELECT ` + now + ` - MIN(created_at) FROM idempotency_record WHERE status = 'PROCESSING'),
  (SELECT COUNT(*) FROM idempotency_record WHERE status = 'PROCESSING' AND locked_until <= ` + now + `),
  (SELECT COUNT(*) FROM idempotency_record WHERE status IN ('DONE', 'FAILED') AND expires_at <= ` + now + `)`,
	// The whole database file: SQLite keeps no per-table size without the
	// dbstat extension, and the records dominate this file.
	TableBytes: `SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`,
	PurgeOlderThan: `DELETE FROM idempotency_record
WHERE (scope, idempotency_key) IN (
  SELECT scope, idempotency_key FROM idempotency_record
  WHERE created_at <= ` + now + ` - ? AND status IN ('DONE', 'FAILED')
  LIMIT ?)`,
	IsDuplicate: func(err error) bool {
		code, ok := errorCode(err)
		return ok && (code == sqliteConstraintPrimaryKey || code == sqliteConstraintUnique)
	},
	IsTransient: func(err error) bool {
		code, ok := errorCode(err)
		return ok && (code&0xff == sqliteBusy || code&0xff == sqliteLocked)
	},
	SingleWriter: true,
}

func errorCode(err error) (int, bool) {
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return 0, false
	}
	return se.Code(), true
}

// NewStore returns the Store over a database opened with Open and migrated
// with Migrate.
func NewStore(db *sql.DB) *idempotency.SQLStore {
	return idempotency.NewSQLStore(db, Dialect)
}

// Migrate applies the SQLite schema (idempotency_record and the reference
// purchase_order table) and records applied versions in schema_migrations.
// It is safe to call on every start, also from several goroutines or
// processes at once.
func Migrate(ctx context.Context, db *sql.DB) error {
	// SQLite has no named lock, so two migrators may both run a migration's
	// (idempotent) statements and then both record its version: the loser
	// fails on the schema_migrations primary key. Running again then finds the
	// version recorded and continues. Each such loss means one more version
	// is recorded, so one attempt per migration, plus one, always suffices.
	list, err := migrations.List("sqlite")
	if err != nil {
		return err
	}
	for range len(list) + 1 {
		if err = migrations.Apply(ctx, db, "sqlite"); err == nil || !Dialect.IsDuplicate(err) {
			return err
		}
	}
	return err
}

// dsnParams configures every connection Open makes. busy_timeout runs first
// (the driver orders it so), so the others wait rather than fail while
// another connection holds a lock.
//
//   - journal_mode(WAL): readers never block the writer nor it them; the
//     mode is stored in the file, so later connections find it set.
//   - synchronous(NORMAL): in WAL mode, commits survive an application crash;
//     a power loss may drop the last commits, but the business rows and the
//     idempotency record commit together, so they are lost together and a
//     retry executes again.
//   - foreign_keys(1): SQLite does not enforce foreign keys unless asked.
//   - _txlock=immediate: BeginTx issues BEGIN IMMEDIATE and takes the write
//     lock up front, waiting under busy_timeout. A deferred transaction that
//     reads and then writes must upgrade its snapshot, and fails at once with
//     SQLITE_BUSY_SNAPSHOT, without waiting, if another writer committed in
//     between.
const dsnParams = "_pragma=busy_timeout(5000)" +
	"&_pragma=journal_mode(WAL)" +
	"&_pragma=synchronous(NORMAL)" +
	"&_pragma=foreign_keys(1)" +
	"&_txlock=immediate"

// maxConns bounds the pool. Writes are serialised by SQLite's lock however
// many connections there are; the extra connections let reads (Lookup of a
// duplicate, a replay) run in WAL mode while a business transaction holds the
// write lock. Beyond a handful they buy nothing, as all run in-process.
const maxConns = 8

// Open opens (creating if needed) the SQLite database file at path with the
// modernc.org/sqlite driver, configured for concurrent HTTP requests: WAL
// journal, busy_timeout 5s, synchronous NORMAL, foreign keys on, and
// transactions that take the write lock at BEGIN. The pool holds up to 8
// connections and keeps them open.
//
// path is a file name, not a DSN. In-memory databases are refused: each
// pooled connection would see a database of its own.
func Open(path string) (*sql.DB, error) {
	switch {
	case path == "" || path == ":memory:":
		return nil, fmt.Errorf("sqlite: open %q: want a file path; in-memory databases are per connection", path)
	case strings.HasPrefix(path, "file:") || strings.Contains(path, "?"):
		return nil, fmt.Errorf("sqlite: open %q: want a file path, not a URI or DSN", path)
	}
	db, err := sql.Open("sqlite", path+"?"+dsnParams)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(maxConns)
	// Idle connections stay open: each new one re-runs the pragmas, and
	// closing the last one checkpoints and removes the WAL.
	db.SetMaxIdleConns(maxConns)
	// Connect now, so that a bad path fails here and the switch to WAL
	// happens on one connection before concurrent requests open more.
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}
