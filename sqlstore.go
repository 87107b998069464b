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

	// withCommit: db is from OpenMySQL, whose connections send the
	// record's statement in the business transaction with its COMMIT.
	withCommit bool
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
	return s.BeginTxOptions(ctx, nil)
}

// BeginTxOptions implements TxOptionsBeginner.
func (s *SQLStore) BeginTxOptions(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	s.sqlFor(ctx) // adapt before the transaction holds a connection
	return s.db.BeginTx(ctx, opts)
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
		if s.withCommit {
			ctx = withCommit(ctx)
		}
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
