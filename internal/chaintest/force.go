package chaintest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/orderguard/idempotency"
)

// How Run makes single-phase run a chain again (Rerun), with the
// database's own behaviour: a deadlock it resolves by rolling the run back,
// a record past its retention the request must renew.

// storeExpired stores a finished record past its retention under key, as
// an earlier request's would be.
func (s *suite) storeExpired(ctx context.Context, key string) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version, locked_until,
   response_status, response_body, created_at, updated_at, expires_at)
VALUES ('', ?, 'an earlier request', 'DONE', 'chaintest-earlier', 2, NULL,
   201, '', NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 1 SECOND)`, key); err != nil {
		return fmt.Errorf("chaintest: store an expired record: %w", err)
	}
	return nil
}

// heavyRows is how many rows the transaction holding a record writes
// besides it, so that in the deadlock it makes with the first run the
// database rolls the run back: InnoDB picks the transaction that wrote less.
const heavyRows = 100

// holdRecord inserts the key's record in a transaction left open, with
// heavyRows more rows. The first run of the chain inserts a row of its own
// (Exchange.forceDeadlock) that this transaction then waits for; the run's
// record INSERT waits for this one's record: a deadlock, which the database
// ends by rolling the run back (1213). The transaction is rolled back when
// the second run starts (Exchange.beginRun), and that run inserts the
// record.
func (s *suite) holdRecord(key, tag string) (*sql.Tx, error) {
	tx, err := s.db.Begin()
	if err != nil {
		return nil, fmt.Errorf("chaintest: hold the record: %w", err)
	}
	rows := make([]string, heavyRows)
	args := make([]any, heavyRows)
	for i := range rows {
		rows[i], args[i] = "(?)", fmt.Sprintf("%s-held-%d", tag, i)
	}
	if _, err := tx.Exec("INSERT INTO chaintest_lock (tag) VALUES "+strings.Join(rows, ", "), args...); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("chaintest: hold the record: %w", err)
	}
	if _, err := tx.Exec(`INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version, locked_until,
   created_at, updated_at, expires_at)
VALUES ('', ?, 'a concurrent request', 'PROCESSING', 'chaintest-blocker', 1, NOW(6) + INTERVAL 1 MINUTE,
   NOW(6), NOW(6), NOW(6) + INTERVAL 1 DAY)`, key); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("chaintest: hold the record: %w", err)
	}
	return tx, nil
}

// runObserver tells each request's Exchange when the middleware starts a
// run of its chain.
type runObserver struct{}

func (runObserver) Observe(context.Context, idempotency.Event) {}

func (runObserver) StartStage(ctx context.Context, st idempotency.Stage, _ string) (context.Context, func(idempotency.StageEnd)) {
	if ex, ok := ctx.Value(exchangeKey{}).(*Exchange); ok {
		switch st {
		case idempotency.StageExecute:
			ex.beginRun()
		case idempotency.StageFinalize:
			ex.finalizeRun(ctx)
		}
	}
	return ctx, func(idempotency.StageEnd) {}
}
