package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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

// SQLStore is a Store over database/sql, parameterised by a Dialect.
type SQLStore struct {
	db      *sql.DB
	dialect Dialect // as given, statement defaults filled

	adaptMu       sync.Mutex
	adapted       atomic.Pointer[Dialect] // dialect after Adapt, once it succeeded
	adaptFailedAt atomic.Int64            // Unix ns of the last failed Adapt

	// retries bounds how often a transient error on a single statement is
	// retried; backoff is jittered between retryBase and 2*retryBase.
	retries   int
	retryBase time.Duration
}

var _ Store = (*SQLStore)(nil)

// NewSQLStore returns a Store that runs d's statements on db.
func NewSQLStore(db *sql.DB, d Dialect) *SQLStore {
	d = d.withStatementDefaults()
	s := &SQLStore{db: db, dialect: d, retries: 4, retryBase: 5 * time.Millisecond}
	if d.Adapt == nil {
		s.adapted.Store(&d)
	}
	return s
}

// sqlFor returns the dialect adapted to the server, adapting it first if
// that has not succeeded yet. Until it does, the statements as given serve.
// It may need a connection of its own, so it is never called while a
// transaction holds one (BeginTx adapts first; see sqlNow): with the pool
// exhausted by open transactions it would wait for one of them to end. It
// never makes a caller wait for another's adaptation: while one runs (at
// most adaptTimeout), or for adaptBackoff after one failed, the others use
// the statements as given.
func (s *SQLStore) sqlFor(ctx context.Context) *Dialect {
	if d := s.adapted.Load(); d != nil {
		return d
	}
	if time.Since(time.Unix(0, s.adaptFailedAt.Load())) < adaptBackoff || !s.adaptMu.TryLock() {
		return &s.dialect
	}
	defer s.adaptMu.Unlock()
	if d := s.adapted.Load(); d != nil {
		return d
	}
	ctx, cancel := context.WithTimeout(ctx, adaptTimeout)
	defer cancel()
	d, err := s.dialect.Adapt(ctx, s.db, s.dialect)
	if err != nil {
		s.adaptFailedAt.Store(time.Now().UnixNano())
		return &s.dialect
	}
	d = d.withStatementDefaults()
	s.adapted.Store(&d)
	return &d
}

// Adapting the dialect is bounded, and a failure is retried no sooner than
// adaptBackoff later.
const (
	adaptTimeout = 2 * time.Second
	adaptBackoff = time.Second
)

// sqlNow is sqlFor without adapting: for statements inside a transaction.
func (s *SQLStore) sqlNow() *Dialect {
	if d := s.adapted.Load(); d != nil {
		return d
	}
	return &s.dialect
}

var _ TextChecker = (*SQLStore)(nil)

// CheckText implements TextChecker with the dialect's CheckText.
func (s *SQLStore) CheckText(v string) error {
	if s.dialect.CheckText == nil {
		return nil
	}
	return s.dialect.CheckText(v)
}

// SingleWriter reports the dialect's SingleWriter.
func (s *SQLStore) SingleWriter() bool { return s.dialect.SingleWriter }

// DB returns the underlying database handle.
func (s *SQLStore) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect.
func (s *SQLStore) Dialect() Dialect { return s.dialect }

// exec runs an autocommit statement, retrying transient failures (deadlock,
// lock wait timeout) with bounded jittered backoff. Autocommit statements roll
// back on those errors by themselves, so retrying never leaves a transaction
// open.
func (s *SQLStore) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for attempt := 0; ; attempt++ {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err == nil || attempt >= s.retries || !s.dialect.IsTransient(err) {
			return res, err
		}
		backoff := s.retryBase<<attempt + time.Duration(rand.Int64N(int64(s.retryBase<<attempt)+1))
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
	}
}

// Claim implements Store.
func (s *SQLStore) Claim(ctx context.Context, c Claim) (Lease, error) {
	if err := c.fits(s.dialect.CheckText); err != nil {
		return Lease{}, err
	}
	res, err := s.exec(ctx, s.dialect.Claim, c.Scope, c.Key, c.Fingerprint, c.Owner,
		c.Lease.Microseconds(), c.Retention.Microseconds())
	if err == nil {
		err = s.insertedNothing(res)
	}
	if err != nil {
		if errors.Is(err, ErrKeyClaimed) || s.dialect.IsDuplicate(err) {
			return Lease{}, ErrKeyClaimed
		}
		return Lease{}, fmt.Errorf("idempotency: claim: %w", err)
	}
	return Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: 1}, nil
}

// Lookup implements Store.
func (s *SQLStore) Lookup(ctx context.Context, scope, key string) (*Record, error) {
	if s.CheckText(scope) != nil || s.CheckText(key) != nil {
		return nil, ErrRecordNotFound // the table cannot hold the key, so no record has it
	}
	rec := &Record{Scope: scope, Key: key}
	err := scanRecord(s.db.QueryRowContext(ctx, s.sqlFor(ctx).Lookup, scope, key), rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrRecordNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: lookup: %w", err)
	}
	return rec, nil
}

// scanRecord reads Lookup's columns, after any leading destinations.
func scanRecord(row interface{ Scan(...any) error }, rec *Record, leading ...any) error {
	var (
		status                                   string
		respStatus                               sql.NullInt64
		respHeaders, respBody                    []byte
		created, updated, lockedUntil, expiresAt dbTime
		leaseExpired, expired                    sql.NullBool
		readAt                                   dbTime
	)
	dest := append(leading, &rec.Fingerprint, &status, &rec.Owner, &rec.Version, &respStatus, &respHeaders, &respBody,
		&created, &updated, &lockedUntil, &expiresAt, &leaseExpired, &expired, &readAt)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	rec.Status = Status(status)
	rec.CreatedAt, rec.UpdatedAt = created.Time, updated.Time
	rec.LockedUntil, rec.ExpiresAt = lockedUntil.Time, expiresAt.Time
	rec.LeaseExpired, rec.Expired = leaseExpired.Bool, expired.Bool
	rec.ReadAt = readAt.Time
	if respStatus.Valid {
		snap := &Snapshot{StatusCode: int(respStatus.Int64), Body: respBody, Header: http.Header{}}
		if len(respHeaders) > 0 {
			if err := json.Unmarshal(respHeaders, &snap.Header); err != nil {
				return fmt.Errorf("stored headers: %w", err)
			}
		}
		if snap.Body == nil {
			snap.Body = []byte{}
		}
		rec.Snapshot = snap
	}
	return nil
}

// TakeOver implements Store.
func (s *SQLStore) TakeOver(ctx context.Context, c Claim, from Lease) (Lease, error) {
	if err := c.fits(s.dialect.CheckText); err != nil {
		return Lease{}, err
	}
	res, err := s.exec(ctx, s.dialect.TakeOver, c.Fingerprint, c.Owner,
		c.Lease.Microseconds(), c.Retention.Microseconds(), c.Scope, c.Key, from.Owner, from.Version)
	if err := s.fenced(res, err, "take over"); err != nil {
		return Lease{}, err
	}
	return Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: from.Version + 1}, nil
}

// BeginTx implements Store.
func (s *SQLStore) BeginTx(ctx context.Context) (*sql.Tx, error) {
	s.sqlFor(ctx) // adapt before the transaction holds a connection
	return s.db.BeginTx(ctx, nil)
}

// FinishTx implements Store.
func (s *SQLStore) FinishTx(ctx context.Context, tx *sql.Tx, l Lease, st Status, snap *Snapshot, retention time.Duration) (Lease, error) {
	args, err := finishArgs(l, st, snap, retention)
	if err != nil {
		return Lease{}, err
	}
	res, err := tx.ExecContext(ctx, s.sqlNow().FinishInTx, args...)
	if err := s.fenced(res, err, "finish"); err != nil {
		return Lease{}, err
	}
	l.Version++
	return l, nil
}

// Finish implements Store.
func (s *SQLStore) Finish(ctx context.Context, l Lease, st Status, snap *Snapshot, retention time.Duration) (Lease, error) {
	args, err := finishArgs(l, st, snap, retention)
	if err != nil {
		return Lease{}, err
	}
	res, err := s.exec(ctx, s.dialect.Finish, args...)
	if err := s.fenced(res, err, "finish"); err != nil {
		return Lease{}, err
	}
	l.Version++
	return l, nil
}

// InsertFinal implements Store.
func (s *SQLStore) InsertFinal(ctx context.Context, tx *sql.Tx, c Claim, st Status, snap *Snapshot) error {
	if err := c.fits(s.dialect.CheckText); err != nil {
		return err
	}
	args, err := finishArgs(Lease{}, st, snap, c.Retention)
	if err != nil {
		return err
	}
	args = append([]any{c.Scope, c.Key, c.Fingerprint, args[0], c.Owner}, args[1:5]...)
	var res sql.Result
	if tx != nil {
		res, err = tx.ExecContext(ctx, s.sqlNow().InsertFinalInTx, args...)
	} else {
		res, err = s.exec(ctx, s.dialect.InsertFinal, args...)
	}
	if err == nil {
		err = s.insertedNothing(res)
	}
	if errors.Is(err, ErrKeyClaimed) || s.dialect.IsDuplicate(err) {
		return ErrKeyClaimed
	}
	if err != nil {
		return fmt.Errorf("idempotency: insert final record: %w", err)
	}
	return nil
}

// Stats is a summary of the record table for operators.
type Stats struct {
	ByStatus         map[Status]int64
	OldestProcessing time.Duration // age of the oldest PROCESSING record; 0 if none
	ExpiredLeases    int64         // PROCESSING records whose lease has expired
	AwaitingPurge    int64         // final records past retention
	TableBytes       int64         // -1 when the database cannot tell
}

// Stats reads the summary.
func (s *SQLStore) Stats(ctx context.Context) (*Stats, error) {
	st := &Stats{ByStatus: map[Status]int64{}, TableBytes: -1}
	rows, err := s.db.QueryContext(ctx, s.dialect.CountByStatus)
	if err != nil {
		return nil, fmt.Errorf("idempotency: stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var status string
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			return nil, fmt.Errorf("idempotency: stats: %w", err)
		}
		st.ByStatus[Status(status)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotency: stats: %w", err)
	}
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, s.dialect.Health).Scan(&oldest, &st.ExpiredLeases, &st.AwaitingPurge); err != nil {
		return nil, fmt.Errorf("idempotency: stats: %w", err)
	}
	st.OldestProcessing = time.Duration(oldest.Int64) * time.Microsecond
	var size sql.NullInt64
	if err := s.db.QueryRowContext(ctx, s.dialect.TableBytes).Scan(&size); err != nil {
		return nil, fmt.Errorf("idempotency: stats: table size: %w", err)
	}
	if size.Valid {
		st.TableBytes = size.Int64
	}
	return st, nil
}

// PurgeOlderThan deletes final records created more than age ago, in
// batches of batchSize, and returns how many it deleted. PROCESSING records
// are never deleted.
func (s *SQLStore) PurgeOlderThan(ctx context.Context, age time.Duration, batchSize int) (int64, error) {
	var total int64
	for {
		n, err := s.purgeOlderThanBatch(ctx, age, batchSize)
		total += n
		if err != nil {
			return total, fmt.Errorf("idempotency: purge older than %v: %w", age, err)
		}
		if n < int64(batchSize) {
			return total, nil
		}
	}
}

// purgeOlderThanBatch deletes one batch under READ COMMITTED: the statement
// scans without an index, and at this level InnoDB locks only the rows it
// deletes, not every row and gap it reads.
func (s *SQLStore) purgeOlderThanBatch(ctx context.Context, age time.Duration, batchSize int) (int64, error) {
	opts := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	if s.dialect.SingleWriter {
		opts = nil // SQLite has one isolation level
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	res, err := tx.ExecContext(ctx, s.dialect.PurgeOlderThan, age.Microseconds(), batchSize)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// Release implements Store.
func (s *SQLStore) Release(ctx context.Context, l Lease) error {
	res, err := s.exec(ctx, s.dialect.Release, l.Scope, l.Key, l.Owner, l.Version)
	return s.fenced(res, err, "release")
}

// Extend implements Store.
func (s *SQLStore) Extend(ctx context.Context, l Lease, d time.Duration) (Lease, error) {
	res, err := s.exec(ctx, s.dialect.Extend, d.Microseconds(), l.Scope, l.Key, l.Owner, l.Version)
	if err := s.fenced(res, err, "extend lease"); err != nil {
		return Lease{}, err
	}
	l.Version++
	return l, nil
}

// ExpiredLeases implements Store.
func (s *SQLStore) ExpiredLeases(ctx context.Context, limit int) ([]*Record, error) {
	rows, err := s.db.QueryContext(ctx, s.dialect.ExpiredLeases, limit)
	if err != nil {
		return nil, fmt.Errorf("idempotency: expired leases: %w", err)
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		rec := &Record{}
		if err := scanRecord(rows, rec, &rec.Scope, &rec.Key); err != nil {
			return nil, fmt.Errorf("idempotency: expired leases: %w", err)
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

// Purge implements Store.
func (s *SQLStore) Purge(ctx context.Context, limit int) (int64, error) {
	res, err := s.exec(ctx, s.dialect.Purge, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge: %w", err)
	}
	return res.RowsAffected()
}

// insertedNothing returns ErrKeyClaimed when an insert of a dialect with
// InsertSkipsDuplicate met an existing record and so affected no row.
func (s *SQLStore) insertedNothing(res sql.Result) error {
	if !s.dialect.InsertSkipsDuplicate {
		return nil
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return err
	case n == 0:
		return ErrKeyClaimed
	}
	return nil
}

// fenced turns the result of a fenced statement into ErrLeaseLost when it
// matched no row. Every fenced statement changes the row it matches (it bumps
// lease_version or moves locked_until), so RowsAffected is reliable without
// the driver's clientFoundRows option.
func (s *SQLStore) fenced(res sql.Result, err error, op string) error {
	if err != nil {
		return fmt.Errorf("idempotency: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idempotency: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("idempotency: %s: %w", op, ErrLeaseLost)
	}
	return nil
}

func finishArgs(l Lease, st Status, snap *Snapshot, retention time.Duration) ([]any, error) {
	if !st.Final() {
		return nil, fmt.Errorf("idempotency: finish with non-final status %q", st)
	}
	if snap == nil {
		return nil, errors.New("idempotency: finish without a snapshot")
	}
	headers, err := json.Marshal(snap.Header)
	if err != nil {
		return nil, fmt.Errorf("idempotency: encode snapshot headers: %w", err)
	}
	body := snap.Body
	if body == nil {
		body = []byte{}
	}
	return []any{string(st), snap.StatusCode, headers, body, retention.Microseconds(),
		l.Scope, l.Key, l.Owner, l.Version}, nil
}

// dbTime scans the time representations the supported drivers produce:
// time.Time (MySQL with parseTime=true), text (MySQL without it) and integer
// Unix microseconds (the SQLite schema).
type dbTime struct{ Time time.Time }

func (t *dbTime) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		t.Time = time.Time{}
	case time.Time:
		t.Time = v.UTC()
	case int64:
		t.Time = time.UnixMicro(v).UTC()
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	default:
		return fmt.Errorf("idempotency: cannot scan %T as time", v)
	}
	return nil
}

func (t *dbTime) parse(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		t.Time = time.UnixMicro(n).UTC()
		return nil
	}
	parsed, err := time.Parse("2006-01-02 15:04:05.999999", s)
	if err != nil {
		return fmt.Errorf("idempotency: scan time %q: %w", s, err)
	}
	t.Time = parsed
	return nil
}
