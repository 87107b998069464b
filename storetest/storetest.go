// Package storetest is the conformance suite every idempotency.Store must
// pass. A store's test calls Exercise with a constructor that returns a store
// over a fresh, migrated database.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Exercise runs the conformance suite. newStore is called once per subtest
// and must return a store over an empty, migrated database.
func Exercise(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	ctx := context.Background()
	claim := func(scope, key string) idempotency.Claim {
		return idempotency.Claim{
			Scope: scope, Key: key, Fingerprint: "fp-" + key, Owner: "owner-" + key,
			Lease: time.Minute, Retention: time.Hour,
		}
	}
	snap := &idempotency.Snapshot{
		StatusCode: http.StatusCreated,
		Header:     http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:       []byte(`{"order_no":"1"}`),
	}

	t.Run("Claim_NewKey_CreatesProcessingRecord", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		require.Equal(t, idempotency.Lease{Scope: "s", Key: "k", Owner: "owner-k", Version: 1}, lease)

		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusProcessing, rec.Status)
		require.Equal(t, "fp-k", rec.Fingerprint)
		require.Equal(t, "owner-k", rec.Owner)
		require.EqualValues(t, 1, rec.Version)
		require.False(t, rec.LeaseExpired)
		require.False(t, rec.Expired)
		require.Nil(t, rec.Snapshot)
		require.True(t, rec.LockedUntil.After(rec.CreatedAt))
		require.True(t, rec.ExpiresAt.After(rec.LockedUntil))
	})

	t.Run("Claim_ExistingKey_ReturnsErrKeyClaimed", func(t *testing.T) {
		s := newStore(t)
		_, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		_, err = s.Claim(ctx, claim("s", "k"))
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed)
	})

	t.Run("Claim_KeysAreCaseSensitiveAndScoped", func(t *testing.T) {
		s := newStore(t)
		for _, c := range []idempotency.Claim{claim("s", "k"), claim("s", "K"), claim("other", "k"), claim("", "k")} {
			_, err := s.Claim(ctx, c)
			require.NoError(t, err, "scope %q key %q", c.Scope, c.Key)
		}
	})

	t.Run("Claim_AtTheTableBounds_StoresThem_OneByteMore_IsRefusedAndWritesNothing", func(t *testing.T) {
		s := newStore(t)
		atBounds := idempotency.Claim{
			Scope: strings.Repeat("s", 255), Key: strings.Repeat("k", 255),
			Fingerprint: strings.Repeat("f", 128), Owner: strings.Repeat("o", 128),
			Lease: time.Minute, Retention: time.Hour,
		}
		_, err := s.Claim(ctx, atBounds)
		require.NoError(t, err)
		rec, err := s.Lookup(ctx, atBounds.Scope, atBounds.Key)
		require.NoError(t, err)
		require.Equal(t, atBounds.Fingerprint, rec.Fingerprint)
		require.Equal(t, atBounds.Owner, rec.Owner)

		over := map[string]func(c *idempotency.Claim){
			"empty key":   func(c *idempotency.Claim) { c.Key = "" },
			"key":         func(c *idempotency.Claim) { c.Key += "k" },
			"scope":       func(c *idempotency.Claim) { c.Scope += "s" },
			"fingerprint": func(c *idempotency.Claim) { c.Fingerprint += "f" },
			"owner":       func(c *idempotency.Claim) { c.Owner += "o" },
		}
		for name, grow := range over {
			c := atBounds
			grow(&c)
			_, err := s.Claim(ctx, c)
			require.ErrorIs(t, err, idempotency.ErrClaimOutOfBounds, "Claim, %s", name)
			require.ErrorIs(t, s.InsertFinal(ctx, nil, c, idempotency.StatusDone, snap), idempotency.ErrClaimOutOfBounds, "InsertFinal, %s", name)
			tx, err := s.BeginTx(ctx)
			require.NoError(t, err)
			require.ErrorIs(t, s.InsertFinal(ctx, tx, c, idempotency.StatusDone, snap), idempotency.ErrClaimOutOfBounds, "InsertFinal in a transaction, %s", name)
			require.NoError(t, tx.Commit(), "the refusal left the transaction usable")
			from := idempotency.Lease{Scope: atBounds.Scope, Key: atBounds.Key, Owner: atBounds.Owner, Version: 1}
			_, err = s.TakeOver(ctx, c, from)
			require.ErrorIs(t, err, idempotency.ErrClaimOutOfBounds, "TakeOver, %s", name)
			if c.Key != "" && (c.Scope != atBounds.Scope || c.Key != atBounds.Key) {
				_, err = s.Lookup(ctx, c.Scope, c.Key)
				require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "%s: nothing written", name)
			}
		}
		after, err := s.Lookup(ctx, atBounds.Scope, atBounds.Key)
		require.NoError(t, err)
		after.ReadAt = rec.ReadAt
		require.Equal(t, rec, after, "the record at the bounds is untouched")
	})

	t.Run("AnyBytes_AreStoredByteForByte_OrRefusedByCheckTextBeforeAnyStatement", func(t *testing.T) {
		// Scopes come from credentials (a Latin-1 header, a decoded
		// token) and may hold any bytes. A store holds each byte for byte,
		// as a value of its own, or says it cannot (TextChecker) and then
		// refuses it with ErrClaimOutOfBounds and writes nothing.
		s := newStore(t)
		var check func(string) error
		if tc, ok := s.(idempotency.TextChecker); ok {
			check = tc.CheckText
		}
		holds := func(v string) bool { return check == nil || check(v) == nil }
		values := []string{"caf\xe9", "caf", "a\x00b", "a", "a\x00c", "\xff\xfe", "café", "🦆"}
		for i, v := range values {
			c := idempotency.Claim{
				Scope: v, Key: fmt.Sprintf("k%d-%s", i, v), Fingerprint: "fp-" + v, Owner: "owner-" + v,
				Lease: time.Minute, Retention: time.Hour,
			}
			_, err := s.Claim(ctx, c)
			if !holds(v) {
				require.ErrorIs(t, err, idempotency.ErrClaimOutOfBounds, "Claim of %q, which CheckText refuses", v)
				require.ErrorIs(t, s.InsertFinal(ctx, nil, c, idempotency.StatusDone, snap), idempotency.ErrClaimOutOfBounds, "InsertFinal of %q", v)
				_, err = s.Lookup(ctx, c.Scope, c.Key)
				require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "%q: nothing written, and nothing to find", v)
				continue
			}
			require.NoError(t, err, "Claim of %q, which the store says it holds", v)
			rec, err := s.Lookup(ctx, c.Scope, c.Key)
			require.NoError(t, err, "Lookup of %q", v)
			require.Equal(t, []string{c.Fingerprint, c.Owner}, []string{rec.Fingerprint, rec.Owner}, "%q byte for byte", v)
			final := c
			final.Key += "-final"
			require.NoError(t, s.InsertFinal(ctx, nil, final, idempotency.StatusDone, snap), "InsertFinal of %q", v)
			rec, err = s.Lookup(ctx, final.Scope, final.Key)
			require.NoError(t, err)
			require.Equal(t, c.Fingerprint, rec.Fingerprint)
		}
		for _, v := range values {
			for _, other := range values {
				if v == other || !holds(v) || !holds(other) {
					continue
				}
				// Every key lives in its own scope only: no two values compare equal.
				_, err := s.Lookup(ctx, other, fmt.Sprintf("k%d-%s", slices.Index(values, v), v))
				require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "scope %q must not find the record of scope %q", other, v)
			}
		}
	})

	t.Run("Lookup_Missing_ReturnsErrRecordNotFound", func(t *testing.T) {
		s := newStore(t)
		_, err := s.Lookup(ctx, "s", "nope")
		require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
	})

	t.Run("FinishTx_CommitsSnapshotWithTransaction", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		tx, err := s.BeginTx(ctx)
		require.NoError(t, err)
		finished, err := s.FinishTx(ctx, tx, lease, idempotency.StatusDone, snap, time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 2, finished.Version)
		require.NoError(t, tx.Commit())

		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusDone, rec.Status)
		require.EqualValues(t, 2, rec.Version)
		require.Equal(t, snap, rec.Snapshot)
		require.True(t, rec.LockedUntil.IsZero())
	})

	t.Run("FinishTx_RolledBack_LeavesRecordProcessing", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		tx, err := s.BeginTx(ctx)
		require.NoError(t, err)
		_, err = s.FinishTx(ctx, tx, lease, idempotency.StatusDone, snap, time.Hour)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback())

		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusProcessing, rec.Status)
		require.Nil(t, rec.Snapshot)
	})

	t.Run("Finish_StoresEmptyBodyAndFailedStatus", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		rejected := &idempotency.Snapshot{StatusCode: 422, Header: http.Header{}, Body: []byte{}}
		_, err = s.Finish(ctx, lease, idempotency.StatusFailed, rejected, time.Hour)
		require.NoError(t, err)
		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusFailed, rec.Status)
		require.Equal(t, rejected, rec.Snapshot)
	})

	t.Run("FencedStatements_WithStaleLease_ReturnErrLeaseLost", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		stale := []idempotency.Lease{
			{Scope: "s", Key: "k", Owner: "someone-else", Version: lease.Version},
			{Scope: "s", Key: "k", Owner: lease.Owner, Version: lease.Version + 1},
			{Scope: "s", Key: "other", Owner: lease.Owner, Version: lease.Version},
		}
		for i, l := range stale {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				_, err := s.Finish(ctx, l, idempotency.StatusDone, snap, time.Hour)
				require.ErrorIs(t, err, idempotency.ErrLeaseLost)
				require.ErrorIs(t, s.Release(ctx, l), idempotency.ErrLeaseLost)
				_, err = s.Extend(ctx, l, time.Minute)
				require.ErrorIs(t, err, idempotency.ErrLeaseLost)
				tx, err := s.BeginTx(ctx)
				require.NoError(t, err)
				_, err = s.FinishTx(ctx, tx, l, idempotency.StatusDone, snap, time.Hour)
				require.ErrorIs(t, err, idempotency.ErrLeaseLost)
				require.NoError(t, tx.Rollback())
			})
		}
		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusProcessing, rec.Status, "no stale statement may change the record")
		require.Equal(t, lease.Version, rec.Version)
	})

	t.Run("Finish_OnFinalRecord_ReturnsErrLeaseLost", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		_, err = s.Finish(ctx, lease, idempotency.StatusDone, snap, time.Hour)
		require.NoError(t, err)
		_, err = s.Finish(ctx, lease, idempotency.StatusDone, snap, time.Hour)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
		require.ErrorIs(t, s.Release(ctx, lease), idempotency.ErrLeaseLost)
	})

	t.Run("Release_DeletesRecordSoKeyCanBeClaimedAgain", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, lease))
		_, err = s.Lookup(ctx, "s", "k")
		require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
		_, err = s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
	})

	t.Run("TakeOver_LiveLease_IsRefused", func(t *testing.T) {
		s := newStore(t)
		lease, err := s.Claim(ctx, claim("s", "k"))
		require.NoError(t, err)
		_, err = s.TakeOver(ctx, claim("s", "k"), lease)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	})

	t.Run("TakeOver_ProcessingPastRetentionWithLiveLease_IsRefused", func(t *testing.T) {
		// A heartbeating attempt may outlive its record's retention: only its
		// lease decides when it can be taken over.
		s := newStore(t)
		c := claim("s", "k")
		c.Retention = time.Microsecond
		lease, err := s.Claim(ctx, c)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.False(t, rec.Expired, "a PROCESSING record never expires by retention")
		other := claim("s", "k")
		other.Fingerprint, other.Owner = "fp-other", "owner-other"
		_, err = s.TakeOver(ctx, other, lease)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	})

	t.Run("TakeOver_FencedByOwnerAsWellAsVersion", func(t *testing.T) {
		// Release then a new claim resets the version to 1: a duplicate that
		// read the first record must not take over the second.
		s := newStore(t)
		c := claim("s", "k")
		c.Lease = time.Microsecond
		first, err := s.Claim(ctx, c)
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, first))
		c.Owner = "owner-second"
		_, err = s.Claim(ctx, c)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		_, err = s.TakeOver(ctx, claim("s", "k"), first)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	})

	t.Run("TakeOver_ExpiredLease_ExactlyOneOfManyWins", func(t *testing.T) {
		s := newStore(t)
		c := claim("s", "k")
		c.Lease = time.Microsecond
		lease, err := s.Claim(ctx, c)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			rec, err := s.Lookup(ctx, "s", "k")
			return err == nil && rec.LeaseExpired
		}, 5*time.Second, time.Millisecond)

		const racers = 8
		var wins, losses int
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rc := claim("s", "k")
				rc.Owner = fmt.Sprintf("racer-%d", i)
				_, err := s.TakeOver(ctx, rc, lease)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case errors.Is(err, idempotency.ErrLeaseLost):
					losses++
				default:
					t.Errorf("racer %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, wins)
		require.Equal(t, racers-1, losses)

		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.EqualValues(t, 2, rec.Version)
		require.False(t, rec.LeaseExpired)
		_, err = s.Finish(ctx, lease, idempotency.StatusDone, snap, time.Hour)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost, "the original holder is fenced out")
	})

	t.Run("TakeOver_ExpiredRetention_ReclaimsFinalRecordWithNewFingerprint", func(t *testing.T) {
		s := newStore(t)
		c := claim("s", "k")
		lease, err := s.Claim(ctx, c)
		require.NoError(t, err)
		finished, err := s.Finish(ctx, lease, idempotency.StatusDone, snap, time.Microsecond)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			rec, err := s.Lookup(ctx, "s", "k")
			return err == nil && rec.Expired
		}, 5*time.Second, time.Millisecond)

		c.Fingerprint, c.Owner = "fp-new", "owner-new"
		taken, err := s.TakeOver(ctx, c, finished)
		require.NoError(t, err)
		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusProcessing, rec.Status)
		require.Equal(t, "fp-new", rec.Fingerprint)
		require.Equal(t, taken.Version, rec.Version)
		require.Nil(t, rec.Snapshot, "the old snapshot is gone")
	})

	t.Run("TakeOver_FinalRecordWithinRetention_IsRefused", func(t *testing.T) {
		s := newStore(t)
		c := claim("s", "k")
		c.Lease = time.Microsecond
		lease, err := s.Claim(ctx, c)
		require.NoError(t, err)
		finished, err := s.Finish(ctx, lease, idempotency.StatusDone, snap, time.Hour)
		require.NoError(t, err)
		_, err = s.TakeOver(ctx, c, finished)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	})

	t.Run("Extend_MovesLockedUntil", func(t *testing.T) {
		s := newStore(t)
		c := claim("s", "k")
		c.Lease = time.Second
		lease, err := s.Claim(ctx, c)
		require.NoError(t, err)
		before, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		extended, err := s.Extend(ctx, lease, time.Hour)
		require.NoError(t, err)
		require.Equal(t, lease.Version+1, extended.Version, "a heartbeat fences out readers of the old lease")
		after, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.True(t, after.LockedUntil.Sub(before.LockedUntil) > 30*time.Minute)
		_, err = s.Extend(ctx, lease, time.Hour)
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
		_, err = s.Extend(ctx, extended, time.Hour)
		require.NoError(t, err)
	})

	t.Run("ExpiredLeases_ListsOnlyProcessingRecordsWithExpiredLease", func(t *testing.T) {
		s := newStore(t)
		short := claim("s", "expired")
		short.Lease = time.Microsecond
		_, err := s.Claim(ctx, short)
		require.NoError(t, err)
		_, err = s.Claim(ctx, claim("s", "live"))
		require.NoError(t, err)
		doneClaim := claim("s", "done")
		doneClaim.Lease = time.Microsecond
		doneLease, err := s.Claim(ctx, doneClaim)
		require.NoError(t, err)
		_, err = s.Finish(ctx, doneLease, idempotency.StatusDone, snap, time.Hour)
		require.NoError(t, err)

		var recs []*idempotency.Record
		require.Eventually(t, func() bool {
			recs, err = s.ExpiredLeases(ctx, 10)
			return err == nil && len(recs) == 1
		}, 5*time.Second, time.Millisecond)
		require.Equal(t, "s", recs[0].Scope)
		require.Equal(t, "expired", recs[0].Key)
		require.Equal(t, "owner-expired", recs[0].Owner)
		require.EqualValues(t, 1, recs[0].Version)
		require.True(t, recs[0].LeaseExpired)
	})

	t.Run("ExpiredLeases_RespectsLimit", func(t *testing.T) {
		s := newStore(t)
		for i := range 5 {
			c := claim("s", fmt.Sprint("k", i))
			c.Lease = time.Microsecond
			_, err := s.Claim(ctx, c)
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool {
			recs, err := s.ExpiredLeases(ctx, 3)
			return err == nil && len(recs) == 3
		}, 5*time.Second, time.Millisecond)
	})

	t.Run("Purge_DeletesOnlyExpiredFinalRecords", func(t *testing.T) {
		s := newStore(t)
		finish := func(key string, st idempotency.Status, retention time.Duration) {
			lease, err := s.Claim(ctx, claim("s", key))
			require.NoError(t, err)
			_, err = s.Finish(ctx, lease, st, snap, retention)
			require.NoError(t, err)
		}
		finish("done-old", idempotency.StatusDone, time.Microsecond)
		finish("failed-old", idempotency.StatusFailed, time.Microsecond)
		finish("done-new", idempotency.StatusDone, time.Hour)
		processing := claim("s", "processing-old")
		processing.Lease, processing.Retention = time.Microsecond, time.Microsecond
		_, err := s.Claim(ctx, processing)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)

		n, err := s.Purge(ctx, 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "one batch deletes at most limit records")
		n, err = s.Purge(ctx, 100)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		n, err = s.Purge(ctx, 100)
		require.NoError(t, err)
		require.EqualValues(t, 0, n)

		for key, want := range map[string]bool{"done-old": false, "failed-old": false, "done-new": true, "processing-old": true} {
			_, err := s.Lookup(ctx, "s", key)
			require.Equal(t, want, err == nil, "record %s kept=%v", key, want)
		}
	})

	t.Run("InsertFinal_InTransaction_CommitsWithIt_AndCollidesWithExistingKey", func(t *testing.T) {
		s := newStore(t)
		tx, err := s.BeginTx(ctx)
		require.NoError(t, err)
		require.NoError(t, s.InsertFinal(ctx, tx, claim("s", "k"), idempotency.StatusDone, snap))
		_, err = s.Lookup(ctx, "s", "k")
		require.ErrorIs(t, err, idempotency.ErrRecordNotFound, "invisible before commit")
		require.NoError(t, tx.Commit())

		rec, err := s.Lookup(ctx, "s", "k")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusDone, rec.Status)
		require.Equal(t, snap, rec.Snapshot)
		require.InDelta(t, time.Hour.Seconds(), rec.ExpiresAt.Sub(rec.ReadAt).Seconds(), 60)

		err = s.InsertFinal(ctx, nil, claim("s", "k"), idempotency.StatusFailed, snap)
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed)
		_, err = s.Claim(ctx, claim("s", "k"))
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed)
	})

	t.Run("InsertFinal_CollidesWithAnyRecord_EvenOnePastRetention", func(t *testing.T) {
		s := newStore(t)
		live := claim("s", "live")
		err := s.InsertFinal(ctx, nil, live, idempotency.StatusDone, snap)
		require.NoError(t, err)
		live.Fingerprint = "fp-changed"
		err = s.InsertFinal(ctx, nil, live, idempotency.StatusDone, snap)
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed)

		old := claim("s", "old")
		old.Retention = time.Microsecond
		err = s.InsertFinal(ctx, nil, old, idempotency.StatusFailed, snap)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			rec, err := s.Lookup(ctx, "s", "old")
			return err == nil && rec.Expired
		}, 5*time.Second, time.Millisecond)
		renewed := claim("s", "old")
		renewed.Fingerprint, renewed.Owner = "fp-renewed", "owner-renewed"
		err = s.InsertFinal(ctx, nil, renewed, idempotency.StatusDone, snap)
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed, "an expired key is renewed by a fenced TakeOver, never by an insert")
		rec, err := s.Lookup(ctx, "s", "old")
		require.NoError(t, err)
		require.Equal(t, idempotency.StatusFailed, rec.Status)
		require.Equal(t, "fp-old", rec.Fingerprint, "the old record is untouched")

		processing := claim("s", "processing")
		processing.Retention = time.Microsecond
		_, err = s.Claim(ctx, processing)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		err = s.InsertFinal(ctx, nil, claim("s", "processing"), idempotency.StatusDone, snap)
		require.ErrorIs(t, err, idempotency.ErrKeyClaimed, "a PROCESSING record is never replaced")
	})
}
