package storetest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// ExerciseStats checks the operator queries of a SQLStore: Stats and
// PurgeOlderThan. newStore must return a store over an empty, migrated
// database.
func ExerciseStats(t *testing.T, newStore func(t *testing.T) *idempotency.SQLStore) {
	ctx := context.Background()
	snap := &idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte("{}")}
	claim := func(key string, lease, retention time.Duration) idempotency.Claim {
		return idempotency.Claim{Scope: "s", Key: key, Fingerprint: "fp", Owner: "o-" + key, Lease: lease, Retention: retention}
	}

	t.Run("Stats_CountsStatesExpiredLeasesAndPurgeBacklog", func(t *testing.T) {
		s := newStore(t)
		empty, err := s.Stats(ctx)
		require.NoError(t, err)
		require.Empty(t, empty.ByStatus)
		require.Zero(t, empty.OldestProcessing)

		for i := range 3 {
			_, err := s.Claim(ctx, claim(fmt.Sprint("live", i), time.Hour, time.Hour))
			require.NoError(t, err)
		}
		_, err = s.Claim(ctx, claim("dead", time.Microsecond, time.Hour))
		require.NoError(t, err)
		l, err := s.Claim(ctx, claim("old", time.Hour, time.Hour))
		require.NoError(t, err)
		_, err = s.Finish(ctx, l, idempotency.StatusDone, snap, time.Microsecond)
		require.NoError(t, err)
		l, err = s.Claim(ctx, claim("failed", time.Hour, time.Hour))
		require.NoError(t, err)
		_, err = s.Finish(ctx, l, idempotency.StatusFailed, snap, time.Hour)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)

		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, map[idempotency.Status]int64{
			idempotency.StatusProcessing: 4, idempotency.StatusDone: 1, idempotency.StatusFailed: 1,
		}, st.ByStatus)
		require.EqualValues(t, 1, st.ExpiredLeases)
		require.EqualValues(t, 1, st.AwaitingPurge)
		require.GreaterOrEqual(t, st.OldestProcessing, 10*time.Millisecond)
		require.Less(t, st.OldestProcessing, time.Minute)
		require.NotZero(t, st.TableBytes)
	})

	t.Run("PurgeOlderThan_DeletesOldFinalRecordsOnly", func(t *testing.T) {
		s := newStore(t)
		for i := range 5 {
			l, err := s.Claim(ctx, claim(fmt.Sprint("done", i), time.Hour, time.Hour))
			require.NoError(t, err)
			_, err = s.Finish(ctx, l, idempotency.StatusDone, snap, time.Hour)
			require.NoError(t, err)
		}
		_, err := s.Claim(ctx, claim("processing", time.Hour, time.Hour))
		require.NoError(t, err)

		n, err := s.PurgeOlderThan(ctx, time.Hour, 2)
		require.NoError(t, err)
		require.Zero(t, n, "nothing is an hour old")

		time.Sleep(20 * time.Millisecond)
		n, err = s.PurgeOlderThan(ctx, 10*time.Millisecond, 2)
		require.NoError(t, err)
		require.EqualValues(t, 5, n, "batches of 2 until none is left")
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, map[idempotency.Status]int64{idempotency.StatusProcessing: 1}, st.ByStatus)
	})
}
