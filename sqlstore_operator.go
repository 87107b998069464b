package idempotency

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Operator queries of SQLStore, for idemctl and dashboards: not part of
// the protocol.

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
