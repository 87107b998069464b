package idemredis

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

var modes = []struct {
	name string
	mode idempotency.Mode
}{
	{"claim-first", idempotency.ModeClaimFirst},
	{"single-phase", idempotency.ModeSinglePhase},
}

func TestNew_RefusesAClientWhoseCallsContextsCannotBound(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	_, err := New(rdb, nil)
	require.ErrorContains(t, err, "ContextTimeoutEnabled")
	_, err = New(nil, nil)
	require.Error(t, err)
}

func TestReplay_AnotherInstanceReplaysFromRedisWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		for _, tc := range []struct {
			name   string
			sku    int
			status int
		}{
			{"committed order", 5, http.StatusCreated},
			{"stored rejection", 0, http.StatusUnprocessableEntity},
		} {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 0)
				cfg := idempotency.Config{Mode: m.mode}
				a := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), cfg)
				cacheB := b.newCache(t, redisAddr(), Config{})
				other := b.newInstance(t, cacheB, cfg)

				first := a.post(t, "u1", "k1", tc.sku)
				require.Equal(t, tc.status, first.status, first.body)

				again := other.post(t, "u1", "k1", tc.sku)
				require.Equal(t, tc.status, again.status)
				require.True(t, again.replayed())
				require.Equal(t, first.body, again.body)
				require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
				require.Zero(t, other.runs.Load(), "the handler ran on the second instance")
				other.requireOffTheDatabase(t, "the second instance went to the database")
				require.Equal(t, uint64(1), cacheB.Stats().Hits)
				wantOrders := 1
				if tc.sku == 0 {
					wantOrders = 0
				}
				require.Equal(t, wantOrders, b.orders(t, "u1", "k1"))
			})
		}
	}
}

func TestReplay_AReplayReadFromTheDatabaseIsSharedForTheNextInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	plain := b.newInstance(t, nil, idempotency.Config{}) // writes no Redis entry
	first := plain.post(t, "u1", "k1", 5)
	require.Equal(t, http.StatusCreated, first.status)

	second := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), idempotency.Config{})
	require.True(t, second.post(t, "u1", "k1", 5).replayed())
	require.NotZero(t, second.store.lookups.Load(), "the database answered, then Redis holds it")

	third := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), idempotency.Config{})
	again := third.post(t, "u1", "k1", 5)
	require.True(t, again.replayed())
	require.Equal(t, first.body, again.body)
	third.requireOffTheDatabase(t, "the third instance went to the database")
}

func TestReplay_RedisEntryWithAnotherFingerprint_TheDatabaseDecides(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			cfg := idempotency.Config{Mode: m.mode}
			a := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), cfg)
			other := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), cfg)

			// The key was used with sku 5; sku 6 is another request: the
			// database answers the conflict, not Redis.
			require.Equal(t, http.StatusCreated, a.post(t, "u1", "k1", 5).status)
			conflict := other.post(t, "u1", "k1", 6)
			require.Equal(t, http.StatusConflict, conflict.status)
			require.Equal(t, "key-reused", conflict.problemType(), conflict.body)
			require.NotZero(t, other.store.storeCalls(), "the conflict must come from the database")
			require.Equal(t, 1, b.orders(t, "u1", "k1"))

			// An entry for a key the database does not know, whose
			// fingerprint is another request's: never a conflict, never a
			// replay; the request executes.
			cache := b.newCache(t, redisAddr(), Config{})
			cache.PutReplay(context.Background(), doneRecord("u1", "k2", "another request"), time.Minute)
			fresh := other.post(t, "u1", "k2", 5)
			require.Equal(t, http.StatusCreated, fresh.status, fresh.body)
			require.False(t, fresh.replayed())
			require.Equal(t, 1, b.orders(t, "u1", "k2"))
		})
	}
}

func TestReplay_CorruptOrForeignRedisEntries_AreNeverReplayed(t *testing.T) {
	t.Parallel()
	valid := encodeReplay(doneRecord("u1", "k", "whatever"))
	flipped := append([]byte(nil), valid...)
	flipped[len(flipped)/2] ^= 0x20
	for _, tc := range []struct {
		name  string
		entry func(c *Cache, fingerprint string) []byte
	}{
		{"garbage bytes", func(*Cache, string) []byte { return []byte("\x00\xffnot an entry at all") }},
		{"bit flipped", func(*Cache, string) []byte { return flipped }},
		{"truncated", func(c *Cache, fp string) []byte {
			e := encodeReplay(doneRecord("u1", "k", fp))
			return e[:len(e)-5]
		}},
		{"another scope's entry under this key", func(c *Cache, fp string) []byte {
			return encodeReplay(doneRecord("u2", "k", fp))
		}},
		{"a later version", func(c *Cache, fp string) []byte {
			e := encodeReplay(doneRecord("u1", "k", fp))
			e[len(replayMagic)]++
			return e
		}},
	} {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 0)
				cache := b.newCache(t, redisAddr(), Config{})
				in := b.newInstance(t, cache, idempotency.Config{Mode: m.mode})

				// Learn the request's fingerprint from a first key, so that
				// the planted entries differ from a valid one only as named.
				require.Equal(t, http.StatusCreated, in.post(t, "u1", "learn", 5).status)
				rec, _ := cache.GetReplay(context.Background(), "u1", "learn")
				require.NotNil(t, rec)

				require.NoError(t, b.admin.Set(context.Background(), cache.redisKey("r:", "u1", "k"),
					tc.entry(cache, rec.Fingerprint), time.Minute).Err())
				got := in.post(t, "u1", "k", 5)
				require.Equal(t, http.StatusCreated, got.status, got.body)
				require.False(t, got.replayed())
				require.Equal(t, 1, b.orders(t, "u1", "k"))
				require.NotZero(t, cache.Stats().Corrupt)

				// The committed answer replaces the bad entry.
				again, _ := cache.GetReplay(context.Background(), "u1", "k")
				require.NotNil(t, again)
				require.Equal(t, got.body, string(again.Snapshot.Body))
			})
		}
	}
}

func TestInFlight_DuplicateOnAnotherInstance_IsAnsweredInProgressWithoutExecuting(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			cfg := idempotency.Config{Mode: m.mode}
			a := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), cfg)
			a.release = make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(a.release) }) }
			t.Cleanup(release)
			other := b.newInstance(t, b.newCache(t, redisAddr(), Config{}), cfg)

			firstDone := make(chan answer)
			go func() { ans, _ := a.tryPost("u1", "k1", 5); firstDone <- ans }()
			require.Eventually(t, func() bool { return a.runs.Load() == 1 }, 5*time.Second, time.Millisecond)

			dup := other.post(t, "u1", "k1", 5)
			require.Equal(t, http.StatusConflict, dup.status, dup.body)
			require.Equal(t, "in-progress", dup.problemType())
			require.Equal(t, "1", dup.header.Get("Retry-After"))
			require.Zero(t, other.runs.Load(), "the duplicate executed")
			other.requireOffTheDatabase(t, "the duplicate went to the database")

			// Another request under the same key is not answered from the
			// marker: the database decides. (In single-phase it executes, and
			// whichever commits first owns the key, as without Redis.)
			if m.mode == idempotency.ModeClaimFirst {
				diff := other.post(t, "u1", "k1", 6)
				require.Equal(t, http.StatusConflict, diff.status)
				require.NotZero(t, other.store.storeCalls())
			}

			release()
			first := <-firstDone
			require.Equal(t, http.StatusCreated, first.status)
			retry := other.post(t, "u1", "k1", 5)
			require.True(t, retry.replayed())
			require.Equal(t, first.body, retry.body)
			require.Equal(t, 1, b.orders(t, "u1", "k1"))
		})
	}
}

func TestInFlight_StaleMarkerOfADeadOwner_ExpiresAndTheDatabaseDecides(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			cache := b.newCache(t, redisAddr(), Config{})
			in := b.newInstance(t, cache, idempotency.Config{Mode: m.mode})
			ctx := context.Background()

			// Learn the fingerprint, and finish k-done in the database
			// only (its Redis entry removed, as after a flush).
			done := in.post(t, "u1", "k-done", 5)
			require.Equal(t, http.StatusCreated, done.status)
			rec, _ := cache.GetReplay(ctx, "u1", "k-done")
			require.NotNil(t, rec)
			require.NoError(t, b.admin.Del(ctx, cache.redisKey("r:", "u1", "k-done")).Err())

			// A dead owner's markers, as an instance that crashed mid-request leaves them.
			const ttl = 1200 * time.Millisecond
			for _, key := range []string{"k-new", "k-done"} {
				dead := idempotency.InFlightMarker{Scope: "u1", Key: key, Fingerprint: rec.Fingerprint, Owner: "crashed/0"}
				_, set := cache.MarkInFlight(ctx, dead, ttl)
				require.True(t, set)
			}
			for _, key := range []string{"k-new", "k-done"} {
				got := in.post(t, "u1", key, 5)
				require.Equal(t, http.StatusConflict, got.status, "%s: %s", key, got.body)
				require.Equal(t, "in-progress", got.problemType())
			}
			require.Equal(t, int64(1), in.runs.Load())

			time.Sleep(ttl + 100*time.Millisecond)
			fresh := in.post(t, "u1", "k-new", 5)
			require.Equal(t, http.StatusCreated, fresh.status, fresh.body)
			require.False(t, fresh.replayed())
			replay := in.post(t, "u1", "k-done", 5)
			require.True(t, replay.replayed(), "the database knew k-done: %s", replay.body)
			require.Equal(t, done.body, replay.body)
			require.Equal(t, 1, b.orders(t, "u1", "k-new"))
			require.Equal(t, 1, b.orders(t, "u1", "k-done"))
		})
	}
}

func TestInFlight_AMarkerIsRemovedOnlyByItsOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	cache := b.newCache(t, redisAddr(), Config{})
	ctx := context.Background()
	mine := idempotency.InFlightMarker{Scope: "u1", Key: "k", Fingerprint: "f", Owner: "a/1"}
	theirs := mine
	theirs.Owner = "b/2"
	held, set := cache.MarkInFlight(ctx, mine, time.Minute)
	require.Nil(t, held)
	require.True(t, set)
	held, set = cache.MarkInFlight(ctx, theirs, time.Minute)
	require.NotNil(t, held)
	require.False(t, set)
	require.Equal(t, mine, *held)
	cache.UnmarkInFlight(ctx, theirs) // not theirs to remove
	held, _ = cache.MarkInFlight(ctx, theirs, time.Minute)
	require.NotNil(t, held)
	cache.UnmarkInFlight(ctx, mine)
	held, set = cache.MarkInFlight(ctx, theirs, time.Minute)
	require.Nil(t, held)
	require.True(t, set)
}
