package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// abandon claims a key with a lease that has already expired, as a crashed
// instance would leave it.
func abandon(t *testing.T, store idempotency.Store, scope, key, fingerprint string) idempotency.Lease {
	t.Helper()
	lease, err := store.Claim(context.Background(), idempotency.Claim{
		Scope: scope, Key: key, Fingerprint: fingerprint, Owner: "crashed/" + key,
		Lease: time.Microsecond, Retention: time.Hour,
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := store.Lookup(context.Background(), scope, key)
		return err == nil && rec.LeaseExpired
	}, 5*time.Second, time.Millisecond)
	return lease
}

func insertOrder(t *testing.T, db *sql.DB, orderNo, scope, key string) {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.CreateOrder(context.Background(), tx, &idempotency.Order{
		OrderNo: orderNo, Scope: scope, IdempotencyKey: key, UserID: 7, SKUID: 20001, Quantity: 1,
		UnitPriceCents: 1000, TotalCents: 1000,
	}))
	require.NoError(t, tx.Commit())
}

func TestReconciler_EffectFound_BackfillsSnapshot_EffectMissing_ReleasesKey(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	require.NoError(t, orderservice.Setup(ctx, db, "mysql"))
	store := idempotency.NewMySQLStore(db)
	svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: store})
	require.NoError(t, err)

	abandon(t, store, "7", "made-it", "fp")
	insertOrder(t, db, "O-MADE", "7", "made-it") // the effect committed, the record did not
	abandon(t, store, "7", "lost", "fp")

	var events []idempotency.Outcome
	var mu sync.Mutex
	r := &idempotency.Reconciler{Store: store, Recover: svc.Recover, Observer: idempotency.ObserverFunc(
		func(_ context.Context, e idempotency.Event) {
			mu.Lock()
			events = append(events, e.Outcome)
			mu.Unlock()
		})}
	recovered, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, recovered)
	require.Equal(t, 1, reclaimed)
	require.ElementsMatch(t, []idempotency.Outcome{idempotency.OutcomeRecovered, idempotency.OutcomeReclaimed}, events)

	rec, err := store.Lookup(ctx, "7", "made-it")
	require.NoError(t, err)
	require.Equal(t, idempotency.StatusDone, rec.Status)
	require.Equal(t, http.StatusCreated, rec.Snapshot.StatusCode)
	require.Equal(t, "/orders/O-MADE", rec.Snapshot.Header.Get("Location"))
	var body orderservice.OrderResponse
	require.NoError(t, json.Unmarshal(rec.Snapshot.Body, &body))
	require.Equal(t, "O-MADE", body.OrderNo)

	_, err = store.Lookup(ctx, "7", "lost")
	require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "a key whose effect is missing is free again")

	recovered, reclaimed, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, recovered+reclaimed, "a second pass finds nothing to do")
}

func TestReconciler_ManyInstancesAtOnce_EachRecordSettledExactlyOnce(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	store := idempotency.NewMySQLStore(db)
	const keys = 40
	for i := range keys {
		key := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		abandon(t, store, "s", key, "fp")
		if i%2 == 0 {
			insertOrder(t, db, "O-"+key, "s", key)
		}
	}
	recoverFn := func(ctx context.Context, rec *idempotency.Record) (*idempotency.Snapshot, bool, error) {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ?`,
			rec.Scope, rec.Key).Scan(&n); err != nil {
			return nil, false, err
		}
		return &idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte(rec.Key)}, n == 1, nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var totalRecovered, totalReclaimed int
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &idempotency.Reconciler{Store: store, Recover: recoverFn, BatchSize: 7}
			for {
				rec, rel, err := r.RunOnce(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				totalRecovered += rec
				totalReclaimed += rel
				mu.Unlock()
				if rec+rel == 0 {
					if left, _ := store.ExpiredLeases(ctx, 1); len(left) == 0 {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, keys/2, totalRecovered)
	require.Equal(t, keys/2, totalReclaimed)
	var done, all int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE'`).Scan(&done))
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotency_record`).Scan(&all))
	require.Equal(t, keys/2, done)
	require.Equal(t, keys/2, all)
}

func TestReconciler_LiveHeartbeat_IsNotReleased(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	store := idempotency.NewMySQLStore(db)
	lease := abandon(t, store, "s", "slow", "fp")
	stale, err := store.ExpiredLeases(ctx, 10)
	require.NoError(t, err)
	require.Len(t, stale, 1)

	// The owner is alive after all: its heartbeat lands between the
	// reconciler's read and its release.
	_, err = store.Extend(ctx, lease, time.Minute)
	require.NoError(t, err)
	r := &idempotency.Reconciler{Store: store, Recover: func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
		return nil, false, nil
	}}
	require.ErrorIs(t, store.Release(ctx, idempotency.Lease{Scope: "s", Key: "slow", Owner: stale[0].Owner, Version: stale[0].Version}),
		idempotency.ErrLeaseLost)
	recovered, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, recovered+reclaimed)
	_, err = store.Lookup(ctx, "s", "slow")
	require.NoError(t, err, "the live owner keeps its key")
}

// TestStaleHolder_FinishAfterTakeover_RollsBackItsOrder: A claims and starts
// its transaction; its lease expires; B takes over through the middleware and
// commits; A's fenced finalize fails and A rolls back. Exactly B's order
// remains. Under MariaDB's innodb_snapshot_isolation the failure is error
// 1020 instead of zero rows; both mean the lease was lost.
func TestStaleHolder_FinishAfterTakeover_RollsBackItsOrder(t *testing.T) {
	t.Parallel()
	for _, snapshotIsolation := range []string{"OFF", "ON"} {
		t.Run("innodb_snapshot_isolation="+snapshotIsolation, func(t *testing.T) {
			t.Parallel()
			db, dsn := testdb.MySQL(t)
			ctx := context.Background()
			require.NoError(t, orderservice.Setup(ctx, db, "mysql"))
			cfg, err := mysql.ParseDSN(dsn)
			require.NoError(t, err)
			cfg.Params = map[string]string{"innodb_snapshot_isolation": snapshotIsolation}
			aDB, err := sql.Open("mysql", cfg.FormatDSN())
			require.NoError(t, err)
			t.Cleanup(func() { aDB.Close() })
			var got string
			require.NoError(t, aDB.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&got))
			require.Contains(t, []string{snapshotIsolation, map[string]string{"ON": "1", "OFF": "0"}[snapshotIsolation]}, got)

			storeA := idempotency.NewMySQLStore(aDB)
			body := `{"user_id":7,"sku_id":20001,"quantity":1}`
			op, err := idempotency.New(storeA, &idempotency.Config{Operation: &orderservice.CreateOperation})
			require.NoError(t, err)
			fp, err := op.FingerprintJSON([]byte(body))
			require.NoError(t, err)

			// A: claim with a short lease, begin, read the record (so its
			// snapshot predates B), write its order without the key column.
			leaseA, err := storeA.Claim(ctx, idempotency.Claim{Scope: "7", Key: "k", Fingerprint: fp,
				Owner: "A/1", Lease: 200 * time.Millisecond, Retention: time.Hour})
			require.NoError(t, err)
			txA, err := storeA.BeginTx(ctx)
			require.NoError(t, err)
			var version int64
			require.NoError(t, txA.QueryRow(`SELECT lease_version FROM idempotency_record WHERE scope = '7' AND idempotency_key = 'k'`).Scan(&version))
			require.NoError(t, idempotency.CreateOrder(ctx, txA, &idempotency.Order{OrderNo: "O-A", Scope: "7",
				UserID: 7, SKUID: 20001, Quantity: 1, UnitPriceCents: 1, TotalCents: 1}))
			time.Sleep(250 * time.Millisecond)

			// B: the retry, through the middleware, takes over and commits.
			svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: idempotency.NewMySQLStore(db)})
			require.NoError(t, err)
			srv := httptest.NewServer(svc)
			t.Cleanup(srv.Close)
			b := &testBundle{db: db, srv: srv}
			answerB := b.do(t, call{user: "7", key: "k", body: body})
			require.Equal(t, http.StatusCreated, answerB.Status, answerB.Body)

			// A finalizes late: fenced out.
			_, err = storeA.FinishTx(ctx, txA, leaseA, idempotency.StatusDone,
				&idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte("A")}, time.Hour)
			require.ErrorIs(t, err, idempotency.ErrLeaseLost)
			require.NoError(t, txA.Rollback())

			require.Equal(t, 1, b.orders(t))
			require.Equal(t, 0, b.count(t, "SELECT COUNT(*) FROM purchase_order WHERE order_no = 'O-A'"))
			replay := b.do(t, call{user: "7", key: "k", body: body})
			require.Equal(t, answerB.Body, replay.Body)
		})
	}
}

func jsonRequest(method, path, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func TestPurge_DeletesExpiredRecordsInBatches(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	store := idempotency.NewMySQLStore(db)
	_, err := db.Exec(`INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version, response_status,
   created_at, updated_at, expires_at)
WITH d (n) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
seq (n) AS (SELECT a.n + 10 * b.n + 100 * c.n + 1000 * e.n + 1 FROM d a, d b, d c, d e)
SELECT 's', CONCAT('k', n), 'fp', IF(n % 10 = 0, 'PROCESSING', 'DONE'), 'o', 1, 201,
  NOW(6), NOW(6), NOW(6) - INTERVAL 1 SECOND
FROM seq WHERE n <= 2500`)
	require.NoError(t, err)
	var batches int
	counting := &countingStore{Store: store, purges: &batches}
	n, err := idempotency.Purge(ctx, counting, 1000, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2250, n)
	require.Equal(t, 3, batches)
	var left int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotency_record WHERE status = 'PROCESSING'`).Scan(&left))
	require.Equal(t, 250, left, "PROCESSING records are never purged")
}

type countingStore struct {
	idempotency.Store
	purges *int
}

func (c *countingStore) Purge(ctx context.Context, limit int) (int64, error) {
	*c.purges++
	return c.Store.Purge(ctx, limit)
}

func TestReconciler_FailingRecord_IsSetAsideAndDoesNotStarveTheOthers(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	store := idempotency.NewMySQLStore(db)
	abandon(t, store, "s", "broken", "fp") // oldest lease: first in the queue
	abandon(t, store, "s", "fine", "fp")

	r := &idempotency.Reconciler{Store: store, BatchSize: 1, FailureBackoff: time.Hour,
		Recover: func(_ context.Context, rec *idempotency.Record) (*idempotency.Snapshot, bool, error) {
			if rec.Key == "broken" {
				return nil, true, nil // found, but no snapshot: a broken hook
			}
			return nil, false, nil
		}}
	_, _, err := r.RunOnce(ctx)
	require.ErrorContains(t, err, "no snapshot")
	_, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, reclaimed, "the next pass reaches the record behind the broken one")

	rec, err := store.Lookup(ctx, "s", "broken")
	require.NoError(t, err)
	require.Equal(t, idempotency.StatusProcessing, rec.Status, "the broken record waits for its backoff")
	require.False(t, rec.LeaseExpired)
}
