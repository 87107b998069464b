package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// redisAddr is the Redis the -redis specs use.
func redisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("IDEMPOTENCY_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Redis at %s: %v (CI requires it)", addr, err)
		}
		t.Skipf("Redis at %s: %v", addr, err)
	}
	_ = c.Close()
	return addr
}

// The warm-up opens its connections before the first request, each its own:
// a first call that had to dial and shake hands within the call timeout
// marked Redis down at start-up on a loaded machine.
func TestWarmRedis_OpensEveryConnectionBeforeTheFirstRequest(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })

	require.NoError(t, warmRedis(context.Background(), rdb, redisWarmConns, 5*time.Second))
	st := rdb.PoolStats()
	require.Equal(t, uint32(redisWarmConns), st.TotalConns, "connections open after the warm-up")
	require.Equal(t, uint32(redisWarmConns), st.IdleConns, "all back in the pool, open, for the first requests")
}

// A Redis that cannot be reached at start-up is a warning, not a failure:
// the server starts and its requests go to the database (idemredis fails
// open), as they would if Redis stopped later.
func TestOpenRedis_Unreachable_StartsWithAWarning(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	var logs bytes.Buffer
	cache, closeRedis, err := openRedis(context.Background(), addr, "test:", 50*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	t.Cleanup(closeRedis)
	require.Contains(t, logs.String(), "not reachable at start-up")

	rec, _ := cache.GetReplay(context.Background(), "1001", "k")
	require.Nil(t, rec, "a call to the unreachable Redis is a miss")
	require.Equal(t, idempotency.SharedCacheHealth{Up: true, FailOpens: 1}, cache.Health(),
		"the failed warm-up is not counted against Redis: only requests' calls are")
}
