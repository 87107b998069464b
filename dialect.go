package idempotency

import (
	"context"
	"database/sql"
)

// Dialect is the hand-written SQL of one database for SQLStore. Each
// statement takes its parameters in the order its doc gives; durations are
// passed as integer microseconds and all time arithmetic happens on the
// database's clock.
type Dialect struct {
	// Name identifies the dialect in errors ("mysql", "sqlite").
	Name string

	// Claim inserts a PROCESSING record with lease_version 1.
	// Params: scope, key, fingerprint, owner, lease µs, retention µs.
	Claim string

	// Lookup selects one record. Params: scope, key. Columns:
	// request_fingerprint, status, locked_by, lease_version, response_status,
	// response_headers, response_body, created_at, updated_at, locked_until,
	// expires_at, lease_expired (0/1), expired (0/1), the database's now.
	Lookup string

	// TakeOver re-claims a PROCESSING record whose lease has expired, or a
	// final record whose retention has passed, matching the owner and
	// lease_version read and bumping the version.
	// Params: fingerprint, owner, lease µs, retention µs, scope, key,
	// previous owner, version.
	TakeOver string

	// Finish moves a PROCESSING record to a final status, fenced by owner and
	// version, bumping lease_version.
	// Params: status, response_status, response_headers, response_body,
	// retention µs, scope, key, owner, version.
	Finish string

	// Release deletes a PROCESSING record, fenced.
	// Params: scope, key, owner, version.
	Release string

	// Extend moves locked_until to now + lease and bumps lease_version,
	// fenced. Params: lease µs, scope, key, owner, version.
	Extend string

	// InsertFinal inserts a finished record (single-phase mode); any
	// record under the key, even one past its retention, makes it fail with
	// a duplicate-key error. Params: scope, key, fingerprint, status, owner,
	// response_status, response_headers, response_body, retention µs.
	InsertFinal string

	// FinishInTx and InsertFinalInTx are Finish and InsertFinal as run
	// inside the business transaction, whose read view may predate changes
	// to the record (a heartbeat, a concurrent duplicate's commit). Empty
	// means Finish and InsertFinal. Adapt sets them where the server needs
	// it (MariaDB's innodb_snapshot_isolation).
	FinishInTx      string
	InsertFinalInTx string

	// Adapt, when set, tailors the dialect to the server behind db: it runs
	// once, before the store's first statement that needs it, and again
	// later if it failed. The MySQL dialect uses it for MariaDB's snapshot
	// isolation and for causal reads on a Galera cluster.
	Adapt func(ctx context.Context, db *sql.DB, d Dialect) (Dialect, error)

	// ExpiredLeases selects PROCESSING records whose lease has expired,
	// oldest lease first, with the same columns as Lookup preceded by scope
	// and idempotency_key. Params: limit.
	ExpiredLeases string

	// Purge deletes final records past expires_at, at most limit of them.
	// Params: limit.
	Purge string

	// CountByStatus selects (status, count) over all records.
	CountByStatus string

	// Health selects, by the database's clock: the age in µs of the oldest
	// PROCESSING record (NULL if none), the number of expired leases, and
	// the number of final records past retention awaiting purge.
	Health string

	// TableBytes selects the idempotency_record table's size on disk
	// (data plus indexes), or NULL where the database cannot tell.
	TableBytes string

	// PurgeOlderThan deletes final records created more than age ago,
	// whatever their retention, at most limit of them: an operator's tool.
	// Params: age µs, limit.
	PurgeOlderThan string

	// InsertSkipsDuplicate marks Claim, InsertFinal and InsertFinalInTx
	// statements that insert nothing when a record holds the key (INSERT …
	// ON CONFLICT DO NOTHING) instead of failing with a duplicate-key error:
	// the store reports ErrKeyClaimed when such a statement affected no row.
	// PostgreSQL uses it, where an error inside the business transaction
	// aborts the transaction and every unique violation is logged as a
	// server ERROR; a row count says the same with neither.
	InsertSkipsDuplicate bool

	// SingleWriter marks a database with one writer at a time (SQLite): an
	// open business transaction holds the only write lock, so no other
	// attempt can take its key over and ExtendLease need not (and, from a
	// second connection, could not) write a heartbeat.
	SingleWriter bool

	// CheckText, when set, reports a string that the record table's
	// scope, idempotency_key, request_fingerprint and locked_by columns
	// cannot hold byte for byte (PostgreSQL's text: bytes that are not
	// UTF-8, and NUL). The store refuses a Claim holding one with
	// ErrClaimOutOfBounds before any statement, and the middleware asks
	// first (TextChecker). Nil means the columns hold any bytes (MySQL's
	// VARBINARY, SQLite's TEXT).
	CheckText func(string) error

	// IsDuplicate reports a unique-key violation.
	IsDuplicate func(error) bool
	// IsTransient reports a server's refusal worth retrying for a single
	// autocommit statement, which the server rolled back whole (deadlock,
	// lock wait timeout, a cluster's certification conflict, SQLITE_BUSY).
	// A lost connection is not retried here: the statement may have taken
	// effect, and the middleware reads the record to find out.
	IsTransient func(error) bool
}

// withStatementDefaults fills the statements that default to others.
func (d Dialect) withStatementDefaults() Dialect {
	if d.FinishInTx == "" {
		d.FinishInTx = d.Finish
	}
	if d.InsertFinalInTx == "" {
		d.InsertFinalInTx = d.InsertFinal
	}
	return d
}
