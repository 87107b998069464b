package main

// -redis ADDR: the optional Redis pre-filter (package idemredis) shared by
// every instance of the example server that names the same Redis.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	idemredis "github.com/orderguard/idempotency/redis"
)

const (
	// redisWarmConns is how many connections are opened before the server
	// listens, and kept open while idle (go-redis's MinIdleConns): a call
	// that must first dial and shake hands (HELLO, CLIENT SETINFO: three
	// round trips) may not fit in the call timeout on a loaded machine, and
	// two such calls in a row marked Redis down at start-up.
	redisWarmConns = 4
	// redisWarmTimeout bounds the warm-up. It is a start-up budget, not a
	// call's: a Redis that does not answer within it is reported and the
	// server starts anyway, failing open to the database.
	redisWarmTimeout = 5 * time.Second
)

// openRedis returns the shared cache on addr, writing under prefix
// (-redis-prefix) with the call timeout given (-redis-timeout), and the function that closes its client. It opens
// redisWarmConns connections first, so that the first requests find them
// ready. A Redis that cannot be reached is logged, not fatal: Redis is never
// the source of truth, and the cache probes it until it answers.
func openRedis(ctx context.Context, addr, prefix string, timeout time.Duration, log *slog.Logger) (*idemredis.Cache, func(), error) {
	rdb := redis.NewClient(&redis.Options{
		Addr: addr,
		// As idemredis requires: every call bounded by Config.Timeout, no
		// retry inside it.
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		MinIdleConns: redisWarmConns,
		// No maintenance-notification handshake: one round trip less per
		// new connection, and no log line from servers that lack it.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	shared, err := idemredis.New(rdb, &idemredis.Config{Prefix: prefix, Timeout: timeout, Logger: log})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("-redis: %w", err)
	}
	started := time.Now()
	if err := warmRedis(ctx, rdb, redisWarmConns, redisWarmTimeout); err != nil {
		log.Warn("redis: not reachable at start-up; requests go to the database until it answers",
			"addr", addr, "err", err)
	} else {
		log.Info("redis: connected", "addr", addr, "conns", redisWarmConns, "took", time.Since(started).Round(time.Millisecond),
			"timeout", timeout)
	}
	return shared, func() { _ = rdb.Close() }, nil
}

// warmRedis opens n connections to Redis, each answering a PING within
// budget, so that the pool holds them when the first requests come. They
// are opened one after another: go-redis's connection set-up races with
// itself when several Conns initialise at once (the race detector reports
// it in go-redis v9.23), and n loopback round trips take well under the
// budget.
func warmRedis(ctx context.Context, rdb *redis.Client, n int, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	conns := make([]*redis.Conn, 0, n)
	var errs []error
	for range n {
		// A Conn of its own holds its connection until Close, so the n
		// PINGs dial n connections rather than share one.
		c := rdb.Conn()
		conns = append(conns, c)
		errs = append(errs, c.Ping(ctx).Err())
	}
	for _, c := range conns {
		_ = c.Close() // back to the pool, open
	}
	return errors.Join(errs...)
}

// defaultRedisTimeout is -redis-timeout's default: idemredis's 20ms default
// is a round trip on a quiet machine with room to spare, but on a loaded
// two-core machine a call's reply can wait that long for the process to be
// scheduled (see scripts/redis-startup.sh for the measurement).
const defaultRedisTimeout = 50 * time.Millisecond
