package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
)

// SQLSTATE codes the Dialect classifies.
const (
	sqlStateUniqueViolation      = "23505"
	sqlStateSerializationFailure = "40001"
	sqlStateDeadlockDetected     = "40P01"
	sqlStateLockNotAvailable     = "55P03"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

func init() {
	files, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	migrations.Register("postgres", files)
}

// Dialect is the SQL of PostgreSQL 13+. Its statements take the parameters
// of idempotency.MySQLDialect in the same order and have the same semantics.
//
// Every time comes from the database's clock, read once per statement with
// clock_timestamp() in a one-row derived table named clock: now() would be
// the transaction's start, which inside the business transaction can lie
// long before the statement. Where the clock bounds an index scan (purge,
// the reconciler's scan) it is a scalar subquery, which the planner
// evaluates once and may use as an index bound; a volatile function itself
// cannot be one.
//
// Inserts use ON CONFLICT DO NOTHING (InsertSkipsDuplicate): a key that is
// taken inserts nothing, and the store reads the zero row count as
// ErrKeyClaimed. Fenced statements rely on the row count too, which
// PostgreSQL reports exactly (rows matched and changed), so they need no
// RETURNING.
var Dialect = idempotency.Dialect{
	Name: "postgres",
	Claim: `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, created_at, updated_at, expires_at)
SELECT $1, $2, $3, 'PROCESSING', $4, 1,
  clock.now + $5::bigint * interval '1 microsecond', clock.now, clock.now,
  clock.now + $6::bigint * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS clock
ON CONFLICT (scope, idempotency_key) DO NOTHING`,
	Lookup: `SELECT request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at,
  locked_until IS NULL OR locked_until <= clock.now,
  status <> 'PROCESSING' AND expires_at <= clock.now, clock.now
FROM idempotency_record, (SELECT clock_timestamp() AS now) AS clock
WHERE scope = $1 AND idempotency_key = $2`,
	// SET expressions see the old row, so created_at is judged by the old
	// status: a takeover after retention starts a new record's life, one
	// after a lost lease keeps the original creation time.
	TakeOver: `UPDATE idempotency_record SET
  created_at = CASE WHEN status <> 'PROCESSING' THEN clock.now ELSE created_at END,
  request_fingerprint = $1, status = 'PROCESSING', locked_by = $2,
  lease_version = lease_version + 1,
  locked_until = clock.now + $3::bigint * interval '1 microsecond',
  response_status = NULL, response_headers = NULL, response_body = NULL,
  updated_at = clock.now, expires_at = clock.now + $4::bigint * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS clock
WHERE scope = $5 AND idempotency_key = $6 AND locked_by = $7 AND lease_version = $8
  AND CASE WHEN status = 'PROCESSING' THEN locked_until ELSE expires_at END <= clock.now`,
	Finish: `UPDATE idempotency_record SET
  status = $1, response_status = $2, response_headers = $3, response_body = $4,
  lease_version = lease_version + 1, locked_until = NULL,
  updated_at = clock.now, expires_at = clock.now + $5::bigint * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS clock
WHERE scope = $6 AND idempotency_key = $7 AND locked_by = $8 AND lease_version = $9
  AND status = 'PROCESSING'`,
	Release: `DELETE FROM idempotency_record
WHERE scope = $1 AND idempotency_key = $2 AND locked_by = $3 AND lease_version = $4
  AND status = 'PROCESSING'`,
	Extend: `UPDATE idempotency_record SET
  locked_until = clock.now + $1::bigint * interval '1 microsecond',
  lease_version = lease_version + 1, updated_at = clock.now
FROM (SELECT clock_timestamp() AS now) AS clock
WHERE scope = $2 AND idempotency_key = $3 AND locked_by = $4 AND lease_version = $5
  AND status = 'PROCESSING'`,
	ExpiredLeases: `SELECT scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
  response_status, response_headers, response_body,
  created_at, updated_at, locked_until, expires_at, true, false, clock_timestamp()
FROM idempotency_record
WHERE status = 'PROCESSING' AND locked_until <= (SELECT clock_timestamp())
ORDER BY locked_until LIMIT $1`,
	InsertFinal: insertFinalWithCommit + "\nON CONFLICT (scope, idempotency_key) DO NOTHING",
	// PostgreSQL has no DELETE … LIMIT: a subquery picks the batch along
	// the (status, expires_at) index. SKIP LOCKED passes over a record a
	// takeover is renewing (and lets several purgers share the work); FOR
	// UPDATE re-checks each picked row against the latest version, so a
	// record renewed meanwhile is never deleted.
	Purge: `DELETE FROM idempotency_record
WHERE (scope, idempotency_key) IN (
  SELECT scope, idempotency_key FROM idempotency_record
  WHERE status IN ('DONE', 'FAILED') AND expires_at <= (SELECT clock_timestamp())
  LIMIT $1 FOR UPDATE SKIP LOCKED)`,
	CountByStatus: `SELECT status, COUNT(*) FROM idempotency_record GROUP BY status`,
	Health: `SELECT
  (SELECT (extract(epoch FROM clock.now - MIN(created_at)) * 1000000)::bigint
     FROM idempotency_record WHERE status = 'PROCESSING'),
  (SELECT COUNT(*) FROM idempotency_record WHERE status = 'PROCESSING' AND locked_until <= clock.now),
  (SELECT COUNT(*) FROM idempotency_record WHERE status IN ('DONE', 'FAILED') AND expires_at <= clock.now)
FROM (SELECT clock_timestamp() AS now) AS clock`,
	// Heap, indexes and TOAST (large snapshot bodies live there).
	TableBytes: `SELECT pg_total_relation_size(to_regclass('idempotency_record'))`,
	// No index on created_at (every insert would pay for it): an operator's
	// statement, run under READ COMMITTED, which skips rows others hold.
	PurgeOlderThan: `DELETE FROM idempotency_record
WHERE (scope, idempotency_key) IN (
  SELECT scope, idempotency_key FROM idempotency_record
  WHERE created_at <= (SELECT clock_timestamp()) - $1::bigint * interval '1 microsecond'
    AND status IN ('DONE', 'FAILED')
  LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	InsertSkipsDuplicate: true,
	CheckText:            checkText,
	IsDuplicate:          func(err error) bool { return sqlStateIs(err, sqlStateUniqueViolation) },
	// An autocommit statement the server refused whole: safe to run again.
	// 40001 reaches one only under a REPEATABLE READ or SERIALIZABLE
	// default_transaction_isolation, where a statement that meets a row
	// changed since it began fails instead of re-reading it.
	IsTransient: func(err error) bool {
		return sqlStateIs(err, sqlStateSerializationFailure) || sqlStateIs(err, sqlStateDeadlockDetected) ||
			sqlStateIs(err, sqlStateLockNotAvailable)
	},
}

// insertFinalWithCommit is InsertFinal without its ON CONFLICT clause: the
// statement OpenDB's connections send with the COMMIT, where a taken key
// must abort the transaction rather than insert nothing. The driver
// recognises it by this exact text.
const insertFinalWithCommit = `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, response_status, response_headers, response_body,
   created_at, updated_at, expires_at)
SELECT $1, $2, $3, $4, $5, 1, NULL, $6::smallint, $7::jsonb, $8::bytea,
  clock.now, clock.now, clock.now + $9::bigint * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS clock`

// checkText refuses what PostgreSQL's text cannot hold: bytes that are not
// UTF-8 (the client encoding pgx sets; a UTF8 database, the default, stores
// them as sent) and NUL, which no PostgreSQL string holds. The server would
// refuse both with 22021 (character_not_in_repertoire); the store refuses
// them before any statement, and the middleware before the handler runs, so
// that such a request is answered 401 and never told to retry.
func checkText(s string) error {
	switch {
	case !utf8.ValidString(s):
		return errors.New("postgres: not valid UTF-8 (PostgreSQL's text holds UTF-8 without NUL)")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("postgres: holds a NUL byte (PostgreSQL's text holds UTF-8 without NUL)")
	}
	return nil
}

func sqlStateIs(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// NewStore returns the Store over a database opened with Open (or any
// *sql.DB on the pgx stdlib driver) and migrated with Migrate.
func NewStore(db *sql.DB) *idempotency.SQLStore {
	d := Dialect
	if sendsFinalWithCommit(db) {
		d.InsertFinalInTx = insertFinalWithCommit
	}
	return idempotency.NewSQLStore(db, d)
}

// Migrate applies the PostgreSQL schema (idempotency_record and the
// reference purchase_order table) to the current schema (the first of
// search_path) and records applied versions in schema_migrations. It is safe
// to call on every start, also from several processes at once: it holds a
// session advisory lock for that schema while it works.
func Migrate(ctx context.Context, db *sql.DB) error {
	return migrations.Apply(ctx, db, "postgres")
}

// openTimeout bounds Open's first connection when the DSN sets no
// connect_timeout.
const openTimeout = 10 * time.Second

// MaxConns bounds the pool Open makes: three instances of a service fit a
// server's default max_connections (100, of which 3 are reserved for
// superusers) with 22 to spare, for migrations, idemctl, a monitoring
// agent and the backends of an instance that just died, which linger until
// they notice. PostgreSQL serves each connection with a process, and a
// two-core server is busy with far fewer running at once: every executing
// request holds one connection for its business transaction and may need a
// second for a heartbeat or a lookup, and requests beyond that wait for a
// connection in the pool (in database/sql), not in the server. For more
// instances, put PgBouncer in front (see the README) or lower the pool with
// SetMaxOpenConns.
const MaxConns = 25

// Open opens a pool of PostgreSQL connections through pgx's database/sql
// driver, as OpenDB does (single-phase's record rides with the COMMIT). dsn is a pgx connection string, a URL
// (postgres://user@host:5432/db?sslmode=disable) or key=value pairs; runtime
// parameters such as search_path or default_transaction_isolation may be
// given in it. The pool holds up to MaxConns connections and keeps them
// open (each new PostgreSQL connection starts a server process), recycling
// each after 30 minutes. When connections die (the network cut them, the
// server ended them), the pool's limit halves, down to 2, and grows back
// once they live again: a pool whose connections are cut every moment
// then has few processes to start after each cut (README, "PostgreSQL
// connections"). A connection pgx closed because its statement's context
// ended, or one reaped while idle, is not such a death. A SetMaxOpenConns
// of the caller's sets the size the pool grows back to, once the pool
// next adjusts; the idle limit follows the open limit. A
// connection attempt the server refuses for want of a slot waits up to
// SlotWait for one (see NewConnector). Open connects
// once (waiting up to 10s), so a bad DSN or an unreachable server fails
// here.
//
// Keep the server's default isolation, READ COMMITTED, for the pool: the
// store's own statements are written for it. A handler that needs REPEATABLE
// READ or SERIALIZABLE raises its own transaction with SET TRANSACTION
// ISOLATION LEVEL as its first statement (see the package doc).
func Open(dsn string) (*sql.DB, error) { return open(dsn, newAdaptive()) }

func open(dsn string, pool *adaptive) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	cfg.DialFunc = watch(cfg.DialFunc)
	cfg.OnPgError = endedByServer(cfg.OnPgError)
	c := connector{Connector: stdlib.GetConnector(*cfg), pool: pool}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(MaxConns)
	db.SetMaxIdleConns(MaxConns)
	db.SetConnMaxLifetime(30 * time.Minute)
	go c.pool.run(db)
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: open %s@%s:%d/%s: %w", cfg.User, cfg.Host, cfg.Port, cfg.Database, err)
	}
	return db, nil
}
