package idemredis

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Redis round trips per request, counted on the client (a command, a
// script or a pipeline is one). A path that gains one fails here.
//
//	path                                        calls   before (issue 37)
//	new key (either mode; a rejection too)      2       4: GET+PTTL, SET NX, SET, unmark
//	replay from Redis                           1       1
//	replay from this process's cache            0       0
//	replay from the database (Redis missed)     2       4
//
// A new key's calls are one before the store (the replay if Redis holds
// one, else the in-flight marker set: MarkUnlessReplay) and one after the
// answer (the replay written and the marker removed: PutReplayAndUnmark).
func TestRoundTrips_Redis_PerRequest_ModeAndPath(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeSinglePhase, idempotency.ModeClaimFirst} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			calls := &redisCalls{}
			client := newRedisClient(t, redisAddr(), b.rdbDB)
			client.AddHook(calls)
			cache, err := New(client, &Config{Prefix: b.prefix, Timeout: testTimeout})
			require.NoError(t, err)
			in := b.newInstance(t, cache, idempotency.Config{Mode: mode})
			cached := b.newInstance(t, cache, idempotency.Config{Mode: mode, ReplayCacheBytes: 1 << 20})
			// The first calls load the scripts (EVALSHA, then EVAL).
			require.Equal(t, http.StatusCreated, in.post(t, "u1", "warm-up", 5).status)

			count := func(in *instance, key string, sku int) (answer, int64) {
				before := calls.n.Load()
				a := in.post(t, "u1", key, sku)
				return a, calls.n.Load() - before
			}
			requireCalls := func(want int64, a answer, got int64, path string) {
				t.Helper()
				if st := cache.Stats(); st.Errors+st.Skipped > 0 {
					t.Skipf("Redis failed %d calls and skipped %d (a loaded machine): counts not comparable", st.Errors, st.Skipped)
				}
				require.Equal(t, want, got, path)
			}

			a, n := count(in, "new", 5)
			require.Equal(t, http.StatusCreated, a.status)
			requireCalls(2, a, n, "new key")

			a, n = count(in, "new", 5)
			require.True(t, a.replayed())
			requireCalls(1, a, n, "replay from Redis")

			a, n = count(cached, "cached", 5)
			require.Equal(t, http.StatusCreated, a.status)
			requireCalls(2, a, n, "new key on an instance with its replay cache")
			a, n = count(cached, "cached", 5)
			require.True(t, a.replayed())
			requireCalls(0, a, n, "replay from this process's cache")

			require.NoError(t, b.admin.Del(context.Background(), cache.redisKey("r:", "u1", "new")).Err())
			a, n = count(in, "new", 5)
			require.True(t, a.replayed())
			requireCalls(2, a, n, "replay from the database")

			a, n = count(in, "rejected", 0)
			require.Equal(t, http.StatusUnprocessableEntity, a.status)
			requireCalls(2, a, n, "a rejection")
		})
	}
}

// redisCalls counts a client's round trips.
type redisCalls struct{ n atomic.Int64 }

func (c *redisCalls) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (c *redisCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *redisCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}
