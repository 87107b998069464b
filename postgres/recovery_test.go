package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Two attempts died after their claims: one after its transaction
// committed the ledger row (its finish was lost with it), one before. The
// reconciler finishes the first with the effect it finds and releases the
// second; retries then replay the first and execute the second.
func TestReconciler_AbandonedClaims_RecoveredWhenTheEffectExists_ReleasedOtherwise(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{FingerprintFunc: fingerprintOfBody}, &ledgerService{})
	ctx := context.Background()
	const body = `{"account":1,"amount":4}`
	for _, key := range []string{"committed", "lost"} {
		_, err := b.store.Claim(ctx, idempotency.Claim{
			Key: key, Fingerprint: "fp:" + body, Owner: "dead/" + key, Lease: time.Millisecond, Retention: time.Hour,
		})
		require.NoError(t, err)
	}
	_, err := b.db.Exec("INSERT INTO ledger (account, amount, idem_key) VALUES (1, 4, 'committed')")
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)

	r := &idempotency.Reconciler{Store: b.store, Recover: func(ctx context.Context, rec *idempotency.Record) (*idempotency.Snapshot, bool, error) {
		var id int64
		err := b.db.QueryRowContext(ctx, "SELECT id FROM ledger WHERE idem_key = $1", rec.Key).Scan(&id)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil, false, nil
		case err != nil:
			return nil, false, err
		}
		return &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
			Body: fmt.Appendf(nil, `{"ledger_id":%d}`, id)}, true, nil
	}}
	recovered, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, recovered)
	require.Equal(t, 1, reclaimed)

	replay := b.do(t, "committed", body)
	require.Equal(t, http.StatusCreated, replay.Status, replay.Body)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.Equal(t, `{"ledger_id":1}`, replay.Body)
	executed := b.do(t, "lost", body)
	require.Equal(t, http.StatusCreated, executed.Status, executed.Body)
	require.Empty(t, executed.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 2, b.count(t, "SELECT COUNT(*) FROM ledger"), "one effect per key")
}

// Purge runs while requests create and replay keys: it deletes exactly the
// final records past retention, never a live or PROCESSING one, and every
// request, retried as a client retries an answer with Retry-After, ends
// created or replayed (or still in progress).
func TestPurge_UnderLoad_DeletesOnlyExpiredFinalRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, &ledgerService{})
	ctx := context.Background()
	snap := &idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte("{}")}
	for i := range 300 {
		err := b.store.InsertFinal(ctx, nil, idempotency.Claim{Key: fmt.Sprint("old-", i), Fingerprint: "fp", Owner: "o",
			Retention: time.Millisecond}, idempotency.StatusDone, snap)
		require.NoError(t, err)
	}
	_, err := b.store.Claim(ctx, idempotency.Claim{Key: "processing", Fingerprint: "fp", Owner: "o",
		Lease: time.Hour, Retention: time.Millisecond})
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)

	var wg sync.WaitGroup
	answers := make([]answer, 64)
	for i := range 64 {
		wg.Go(func() {
			answers[i] = b.doAsClient(t, fmt.Sprint("live-", i%32), `{"account":2,"amount":1}`)
		})
	}
	var purged int64
	var purgeErr error
	wg.Go(func() {
		for range 10 {
			n, err := idempotency.Purge(ctx, b.store, 25, nil)
			purged, purgeErr = purged+n, errors.Join(purgeErr, err)
		}
	})
	wg.Wait()
	require.NoError(t, purgeErr)
	require.EqualValues(t, 300, purged)
	for i, a := range answers {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, a.Status,
			"request %d for key live-%d: the contract allows 201 (created or replayed) and 409 in progress; got %s", i, i%32, a.Body)
	}
	require.EqualValues(t, 33, b.count(t, "SELECT COUNT(*) FROM idempotency_record"), "32 live keys and the PROCESSING one")
	require.EqualValues(t, 32, b.count(t, "SELECT COUNT(*) FROM ledger"))
}
