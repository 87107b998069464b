package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/sqlite"
	"github.com/orderguard/idempotency/storetest"
)

// newDB returns a fresh, migrated database in a file of its own: an
// in-memory database would differ per pooled connection.
func newDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "idempotency.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, sqlite.Migrate(context.Background(), db))
	return db
}

func claimFor(key string) idempotency.Claim {
	return idempotency.Claim{
		Scope: "orders", Key: key, Fingerprint: "fp-" + key, Owner: "owner-" + key,
		Lease: time.Minute, Retention: time.Hour,
	}
}

func TestStore_Conformance(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(t *testing.T) idempotency.Store {
		return sqlite.NewStore(newDB(t))
	})
}

func TestStore_OperatorQueries(t *testing.T) {
	t.Parallel()
	storetest.ExerciseStats(t, func(t *testing.T) *idempotency.SQLStore {
		return sqlite.NewStore(newDB(t))
	})
}

func TestMigrate_TwiceAndConcurrently_IsSafe(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	require.NoError(t, sqlite.Migrate(ctx, db))

	// A second, empty database migrated by several goroutines at once.
	fresh, err := sqlite.Open(filepath.Join(t.TempDir(), "fresh.db"))
	require.NoError(t, err)
	t.Cleanup(func() { fresh.Close() })
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- sqlite.Migrate(ctx, fresh) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}

	all, err := migrations.List("sqlite")
	require.NoError(t, err)
	for _, d := range []*sql.DB{db, fresh} {
		var n int
		require.NoError(t, d.QueryRow("SELECT COUNT(*) FROM schema_migrations").Scan(&n))
		require.Equal(t, len(all), n, "each version applied once")
		require.NoError(t, d.QueryRow("SELECT COUNT(*) FROM idempotency_record").Scan(&n))
		require.NoError(t, d.QueryRow("SELECT COUNT(*) FROM purchase_order").Scan(&n))
	}
}

func TestOpen_ConfiguresEveryConnection(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	require.Equal(t, 8, db.Stats().MaxOpenConnections)

	// Hold two connections at once so that the pragmas are checked on a
	// connection other than the first.
	c1, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c1.Close()
	c2, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c2.Close()
	for _, c := range []*sql.Conn{c1, c2} {
		var journal string
		var busy, fk, sync int
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal))
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy))
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk))
		require.NoError(t, c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync))
		require.Equal(t, "wal", journal)
		require.Equal(t, 5000, busy)
		require.Equal(t, 1, fk)
		require.Equal(t, 1, sync, "NORMAL")
	}
}

func TestOpen_RefusesInMemoryAndDSNs(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"", ":memory:", "file::memory:", "x.db?mode=ro"} {
		_, err := sqlite.Open(path)
		require.Error(t, err, "path %q", path)
	}
}

// TestBeginTx_TakesWriteLockAtBegin checks _txlock=immediate and the error
// classifiers against real SQLite errors: while a transaction that has not
// written anything is open, a writer that does not wait gets SQLITE_BUSY.
func TestBeginTx_TakesWriteLockAtBegin(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idempotency.db")
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	require.NoError(t, sqlite.Migrate(ctx, db))
	store := sqlite.NewStore(db)

	tx, err := store.BeginTx(ctx)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck

	impatient, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	require.NoError(t, err)
	t.Cleanup(func() { impatient.Close() })
	_, err = impatient.ExecContext(ctx,
		"INSERT INTO purchase_order (order_no, scope, user_id, sku_id, quantity, unit_price_cents, discount_cents, total_cents, status) VALUES ('o', 's', 1, 1, 1, 1, 0, 1, 'NEW')")
	require.Error(t, err)
	require.True(t, sqlite.Dialect.IsTransient(err), "want SQLITE_BUSY, got %v", err)
	require.False(t, sqlite.Dialect.IsDuplicate(err))

	// Readers are not blocked by the writer in WAL mode.
	var n int
	require.NoError(t, impatient.QueryRowContext(ctx, "SELECT COUNT(*) FROM idempotency_record").Scan(&n))
}

func TestDialect_ClassifiesErrors(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	const insert = "INSERT INTO purchase_order (order_no, scope, idempotency_key, user_id, sku_id, quantity, unit_price_cents, discount_cents, total_cents, status) VALUES (?, 's', ?, 1, 1, 1, 1, 0, 1, 'NEW')"
	_, err := db.ExecContext(ctx, insert, "o1", "k1")
	require.NoError(t, err)

	_, unique := db.ExecContext(ctx, insert, "o1", "k2")
	_, err = sqlite.NewStore(db).Claim(ctx, claimFor("k"))
	require.NoError(t, err)
	_, primary := db.ExecContext(ctx, sqlite.Dialect.Claim, "orders", "k", "fp", "o", 1, 1)
	_, syntax := db.ExecContext(ctx, "SELEC 1")

	for name, err := range map[string]error{"unique": unique, "primary key": primary} {
		wrapped := fmt.Errorf("claim: %w", err)
		require.True(t, sqlite.Dialect.IsDuplicate(wrapped), "%s: %v", name, err)
		require.False(t, sqlite.Dialect.IsTransient(wrapped), name)
	}
	require.Error(t, syntax)
	require.False(t, sqlite.Dialect.IsDuplicate(syntax))
	require.False(t, sqlite.Dialect.IsTransient(syntax))
	for _, err := range []error{errors.New("x"), context.Canceled, sql.ErrConnDone} {
		require.False(t, sqlite.Dialect.IsDuplicate(err))
		require.False(t, sqlite.Dialect.IsTransient(err))
	}
}

func TestClaim_TimesUseDatabaseClockInMicroseconds(t *testing.T) {
	t.Parallel()
	store := sqlite.NewStore(newDB(t))
	ctx := context.Background()
	c := claimFor("k")
	c.Lease, c.Retention = 1500*time.Microsecond+30*time.Second, 24*time.Hour+7*time.Microsecond
	before := time.Now()
	_, err := store.Claim(ctx, c)
	require.NoError(t, err)
	rec, err := store.Lookup(ctx, "orders", "k")
	require.NoError(t, err)

	require.WithinDuration(t, before, rec.CreatedAt, 2*time.Second)
	require.Equal(t, rec.CreatedAt, rec.UpdatedAt, "one statement, one 'now'")
	require.Equal(t, c.Lease, rec.LockedUntil.Sub(rec.CreatedAt))
	require.Equal(t, c.Retention, rec.ExpiresAt.Sub(rec.CreatedAt))
	require.Equal(t, time.UTC, rec.CreatedAt.Location())
}

func TestTakeOver_CreatedAtRestartsOnlyAfterRetention(t *testing.T) {
	t.Parallel()
	store := sqlite.NewStore(newDB(t))
	ctx := context.Background()
	c := claimFor("k")
	c.Lease = time.Microsecond
	_, err := store.Claim(ctx, c)
	require.NoError(t, err)
	first, err := store.Lookup(ctx, "orders", "k")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := store.Lookup(ctx, "orders", "k")
		return err == nil && rec.LeaseExpired
	}, 5*time.Second, time.Millisecond)

	// Lease expired, retention not: the record keeps its creation time.
	c.Owner, c.Lease = "second", time.Minute
	lease, err := store.TakeOver(ctx, c, idempotency.Lease{Owner: first.Owner, Version: first.Version})
	require.NoError(t, err)
	rec, err := store.Lookup(ctx, "orders", "k")
	require.NoError(t, err)
	require.Equal(t, first.CreatedAt, rec.CreatedAt)
	require.True(t, rec.UpdatedAt.After(first.UpdatedAt))
	require.Equal(t, "second", rec.Owner)

	// Retention expired: the key is new again, and so is its record.
	done := &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{}, Body: []byte("{}")}
	finished, err := store.Finish(ctx, lease, idempotency.StatusDone, done, time.Microsecond)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := store.Lookup(ctx, "orders", "k")
		return err == nil && rec.Expired
	}, 5*time.Second, time.Millisecond)
	c.Owner = "third"
	_, err = store.TakeOver(ctx, c, finished)
	require.NoError(t, err)
	rec, err = store.Lookup(ctx, "orders", "k")
	require.NoError(t, err)
	require.True(t, rec.CreatedAt.After(first.CreatedAt))
	require.Equal(t, rec.CreatedAt, rec.UpdatedAt)
	require.Equal(t, idempotency.StatusProcessing, rec.Status)
	require.Nil(t, rec.Snapshot)
}

func TestClaim_ConcurrentSameKey_ExactlyOneWins(t *testing.T) {
	t.Parallel()
	store := sqlite.NewStore(newDB(t))
	ctx := context.Background()
	const n = 32
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := claimFor("same")
			c.Owner = fmt.Sprintf("racer-%d", i)
			<-start
			_, errs[i] = store.Claim(ctx, c)
		})
	}
	close(start)
	wg.Wait()

	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, idempotency.ErrKeyClaimed):
		default:
			t.Errorf("racer %d: want nil or ErrKeyClaimed, got %v (busy: %v)", i, err, sqlite.Dialect.IsTransient(err))
		}
	}
	require.Equal(t, 1, wins)
}

func TestFinishTx_ConcurrentTransactions_AllCommit(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	store := sqlite.NewStore(db)
	ctx := context.Background()
	const n = 32
	leases := make([]idempotency.Lease, n)
	for i := range n {
		var err error
		leases[i], err = store.Claim(ctx, claimFor(fmt.Sprintf("k%02d", i)))
		require.NoError(t, err)
	}

	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, lease := range leases {
		wg.Go(func() {
			<-start
			errs[i] = finishWithOrder(ctx, store, lease, i)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "transaction %d", i)
	}

	var orders, done int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM purchase_order").Scan(&orders))
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE' AND lease_version = 2").Scan(&done))
	require.Equal(t, n, orders)
	require.Equal(t, n, done)
}

// finishWithOrder is what the middleware does for one request: the business
// write and the snapshot in one transaction.
func finishWithOrder(ctx context.Context, store *idempotency.SQLStore, lease idempotency.Lease, i int) error {
	tx, err := store.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `INSERT INTO purchase_order
  (order_no, scope, idempotency_key, user_id, sku_id, quantity, unit_price_cents, discount_cents, total_cents, status)
VALUES (?, ?, ?, 1, 1, 1, 100, 0, 100, 'CREATED')`, fmt.Sprintf("order-%02d", i), lease.Scope, lease.Key); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	snap := &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{}, Body: []byte("{}")}
	if _, err := store.FinishTx(ctx, tx, lease, idempotency.StatusDone, snap, time.Hour); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// TestRootPackage_DoesNotDependOnSQLite keeps SQLite out of the build of
// MySQL users: only this package may import the driver.
func TestRootPackage_DoesNotDependOnSQLite(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/orderguard/idempotency").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/orderguard/idempotency")
	for _, dep := range deps {
		require.NotContains(t, dep, "modernc.org/sqlite")
	}
}
