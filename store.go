package idempotency

import (
	"context"
	"database/sql"
	"net/http"
	"time"
)

// Status is the state of an idempotency record.
type Status string

// Record states. PROCESSING is held under a lease; DONE and FAILED are final
// and carry the snapshot that every retry replays.
const (
	StatusProcessing Status = "PROCESSING"
	StatusDone       Status = "DONE"
	StatusFailed     Status = "FAILED"
)

// Final reports whether s is a final state (DONE or FAILED).
func (s Status) Final() bool { return s == StatusDone || s == StatusFailed }

// Snapshot is a stored response: what every retry of a finished key receives.
type Snapshot struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// Lease identifies one attempt's hold on a record. Every statement that
// changes a claimed record matches Owner and Version, so an attempt whose lease
// was taken over can never finish, release or extend its successor's claim.
type Lease struct {
	Scope   string
	Key     string
	Owner   string // instance id plus a random per-attempt token
	Version int64  // fencing token, bumped by every takeover and finish
}

// Record is an idempotency record as read from a Store.
type Record struct {
	Scope       string
	Key         string
	Fingerprint string
	Status      Status
	Owner       string
	Version     int64
	Snapshot    *Snapshot // set when Status is final

	CreatedAt   time.Time
	UpdatedAt   time.Time
	LockedUntil time.Time // zero once final
	ExpiresAt   time.Time

	// LeaseExpired and Expired are judged by the store's clock at read time,
	// so the application never compares its own clock with the database's.
	// Expired (retention passed) is never true of a PROCESSING record.
	LeaseExpired bool
	Expired      bool

	// ReadAt is the store's clock when the record was read, so that
	// ExpiresAt.Sub(ReadAt) is how long the record still lives.
	ReadAt time.Time
}

// Claim describes a new attempt on a key.
type Claim struct {
	Scope       string
	Key         string
	Fingerprint string
	Owner       string
	Lease       time.Duration // how long the PROCESSING record is held
	Retention   time.Duration // how long the record lives before the key is new again
}

// Store keeps idempotency records. Implementations translate driver errors
// into this package's sentinels: ErrKeyClaimed, ErrRecordNotFound and
// ErrLeaseLost. The stores shipped here are SQL stores (MySQL in this
// package, SQLite in package sqlite, PostgreSQL in package postgres); all
// pass storetest.Exercise.
// TxOptionsBeginner is a Store that starts the handler's transaction with
// options: the Middleware uses it when Config.TxOptions is set, and New
// refuses such a Config over a store that is not one.
type TxOptionsBeginner interface {
	BeginTxOptions(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

type Store interface {
	// Claim inserts a PROCESSING record in its own autocommit statement. It
	// returns ErrKeyClaimed if a record for the scope and key exists.
	Claim(ctx context.Context, c Claim) (Lease, error)

	// Lookup reads the record with a fresh statement outside any transaction.
	Lookup(ctx context.Context, scope, key string) (*Record, error)

	// TakeOver claims a record read as held by from (owner and version): a
	// PROCESSING record whose lease has expired, or a final record whose
	// retention has passed. A PROCESSING record never expires by retention:
	// only its lease decides. Exactly one of several racing callers wins; the
	// others get ErrLeaseLost.
	TakeOver(ctx context.Context, c Claim, from Lease) (Lease, error)

	// BeginTx starts the transaction in which the business handler runs.
	BeginTx(ctx context.Context) (*sql.Tx, error)

	// FinishTx marks the record final with its snapshot inside tx, fenced by
	// the lease. It returns ErrLeaseLost if the lease is no longer held.
	FinishTx(ctx context.Context, tx *sql.Tx, l Lease, s Status, snap *Snapshot, retention time.Duration) (Lease, error)

	// Finish is FinishTx in its own autocommit statement.
	Finish(ctx context.Context, l Lease, s Status, snap *Snapshot, retention time.Duration) (Lease, error)

	// Release deletes a PROCESSING record held by l so that the key can
	// execute again. It returns ErrLeaseLost if l no longer holds it.
	Release(ctx context.Context, l Lease) error

	// Extend pushes the lease's expiry to now+d by the store's clock and
	// bumps the version, so that a reconciler that read the expired lease
	// can no longer release it.
	Extend(ctx context.Context, l Lease, d time.Duration) (Lease, error)

	// InsertFinal inserts a finished record with its snapshot: the
	// single-phase mode's only write, inside the business transaction tx (or
	// in autocommit when tx is nil, for a rejection). If any record holds
	// the key it returns ErrKeyClaimed, even one past its retention: such a
	// key is renewed through Claim and TakeOver, which are fenced. A store
	// may send the insert with tx's COMMIT instead (package postgres does,
	// on a database from its OpenDB, and NewMySQLStore on one from
	// OpenMySQL): then tx.Commit reports a taken key as an error matching
	// ErrKeyClaimed, having committed nothing.
	InsertFinal(ctx context.Context, tx *sql.Tx, c Claim, st Status, snap *Snapshot) error

	// ExpiredLeases returns up to limit PROCESSING records whose lease has
	// expired, oldest first: the reconciler's work list.
	ExpiredLeases(ctx context.Context, limit int) ([]*Record, error)

	// Purge deletes up to limit final records whose retention has passed and
	// returns how many it deleted. It never deletes a PROCESSING record.
	Purge(ctx context.Context, limit int) (int64, error)
}
