package idemredis

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderguard/idempotency"
)

// Config configures a Cache. The zero value is usable: every field has a
// default.
type Config struct {
	// Prefix starts every Redis key the Cache writes, so that several
	// services (or tests) can share one Redis. Defaults to "idempotency:".
	Prefix string

	// Timeout bounds every Redis call; a call that takes longer is a miss
	// and the request goes on to the database. Redis is marked down once
	// its calls have failed for Timeout with no answer in between (at most
	// two timed-out calls in a row), and calls skip it from then on.
	// Defaults to 20ms.
	Timeout time.Duration

	// ProbeInterval is how long, once Redis is marked down, calls skip it
	// at no cost before one call, the probe, tries it again. Only a probe's
	// answer marks Redis up. Defaults to 1s.
	ProbeInterval time.Duration

	// MaxProbeInterval bounds the backoff between probes: each failed probe
	// doubles the wait for the next, and so does Redis going down again
	// within MaxProbeInterval of coming back, so that a Redis that flaps
	// (a restart under load, a failing network) is tried less and less
	// often and the state changes, each logged, stay few. After Redis has
	// stayed up for MaxProbeInterval, the next outage starts again from
	// ProbeInterval. Defaults to 16 × ProbeInterval.
	MaxProbeInterval time.Duration

	// MaxTTL bounds how long a replay is kept in Redis (always less than the
	// record's remaining retention, which the middleware passes). Defaults
	// to 1h.
	MaxTTL time.Duration

	// MaxEntryBytes bounds an encoded replay; larger answers are not cached
	// in Redis. Defaults to 64 KiB.
	MaxEntryBytes int

	// DisableInFlightMarkers turns the in-flight markers off: a duplicate
	// of a key executing on another instance then goes to the database (in
	// single-phase, it executes and rolls back). Defaults to false.
	DisableInFlightMarkers bool

	// Logger receives one line per change of Redis's state: a Warn when it
	// is marked down, an Info when a probe finds it back. Defaults to
	// discarding.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idempotency:"
	}
	if c.Timeout == 0 {
		c.Timeout = 20 * time.Millisecond
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = time.Second
	}
	if c.MaxProbeInterval == 0 {
		c.MaxProbeInterval = 16 * c.ProbeInterval
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = time.Hour
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Cache is an idempotency.SharedCache on Redis. Create it with New; it is
// safe for concurrent use.
type Cache struct {
	client redis.UniversalClient
	cfg    Config
	now    func() time.Time
	health *health

	stats struct {
		hits, misses, corrupt, puts, marked, markerHeld atomic.Uint64
	}
}

var (
	_ idempotency.SharedCache               = (*Cache)(nil)
	_ idempotency.SharedCacheHealthReporter = (*Cache)(nil)
)

// New returns a Cache over client. A nil cfg means the defaults. The client
// must be created with ContextTimeoutEnabled, so that Config.Timeout bounds
// every call; give it MaxRetries -1 and DialerRetries 1 as well (a retry
// inside the timeout only delays the fall-back to the database).
func New(client redis.UniversalClient, cfg *Config) (*Cache, error) {
	if client == nil {
		return nil, errors.New("idemredis: New needs a Redis client")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	switch {
	case c.Timeout < 0 || c.ProbeInterval < 0 || c.MaxTTL < 0 || c.MaxEntryBytes < 0:
		return nil, errors.New("idemredis: Timeout, ProbeInterval, MaxTTL and MaxEntryBytes must not be negative")
	case c.MaxProbeInterval < c.ProbeInterval:
		return nil, fmt.Errorf("idemredis: MaxProbeInterval %v is shorter than ProbeInterval %v", c.MaxProbeInterval, c.ProbeInterval)
	case !contextTimeoutEnabled(client):
		return nil, errors.New("idemredis: create the Redis client with ContextTimeoutEnabled: true, or Config.Timeout cannot bound its calls")
	}
	return newCache(client, c, time.Now), nil
}

// newCache is New's Cache on the clock now (tests pass their own).
func newCache(client redis.UniversalClient, c Config, now func() time.Time) *Cache {
	return &Cache{client: client, cfg: c, now: now, health: newHealth(c.ProbeInterval, c.MaxProbeInterval, c.Timeout, now())}
}

func contextTimeoutEnabled(client redis.UniversalClient) bool {
	switch cl := client.(type) {
	case *redis.Client:
		return cl.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return cl.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return cl.Options().ContextTimeoutEnabled
	}
	return true // another implementation: its own business
}

// Stats counts what the Cache did since it was created.
type Stats struct {
	Hits       uint64 // replays found (the middleware still checks the fingerprint)
	Misses     uint64 // replays not found
	Corrupt    uint64 // entries that did not decode or belonged to another scope or key: misses
	Puts       uint64 // replays written
	Marked     uint64 // in-flight markers set
	MarkerHeld uint64 // in-flight markers found held by another attempt
	Errors     uint64 // calls that failed or timed out: the request went on to the database
	Skipped    uint64 // calls not made because Redis was down
	Downs      uint64 // times Redis was marked down
	Ups        uint64 // times a probe found it back
	Down       bool   // Redis is down now
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	s, h := &c.stats, c.health
	return Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(), Corrupt: s.corrupt.Load(), Puts: s.puts.Load(),
		Marked: s.marked.Load(), MarkerHeld: s.markerHeld.Load(), Errors: h.failOpens.Load(),
		Skipped: h.skipped.Load(), Downs: h.downs.Load(), Ups: h.ups.Load(), Down: !h.isUp(),
	}
}

// Health implements idempotency.SharedCacheHealthReporter, for package
// metrics (metrics.WithSharedCache).
func (c *Cache) Health() idempotency.SharedCacheHealth {
	h := c.health
	return idempotency.SharedCacheHealth{
		Up: h.isUp(), FailOpens: h.failOpens.Load(), Skipped: h.skipped.Load(),
		Downs: h.downs.Load(), Ups: h.ups.Load(),
	}
}

// GetReplay implements idempotency.SharedCache: one round trip, GET and PTTL.
func (c *Cache) GetReplay(ctx context.Context, scope, key string) (*idempotency.Record, time.Duration) {
	call, ok := c.begin()
	if !ok {
		return nil, 0
	}
	ctx, cancel := c.context(ctx)
	defer cancel()
	k := c.redisKey("r:", scope, key)
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := c.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, pttl = p.Get(ctx, k), p.PTTL(ctx, k)
		return nil
	})
	if errors.Is(get.Err(), redis.Nil) {
		c.end(call, pttl.Err())
		c.stats.misses.Add(1)
		return nil, 0
	}
	if err != nil {
		c.end(call, err)
		c.stats.misses.Add(1)
		return nil, 0
	}
	c.end(call, nil)
	b, _ := get.Bytes()
	rec, err := decodeReplay(b, scope, key)
	if err != nil {
		c.stats.corrupt.Add(1)
		c.stats.misses.Add(1)
		return nil, 0
	}
	c.stats.hits.Add(1)
	return rec, max(0, pttl.Val()) // -1 (no expiry: not ours) means unknown
}

// PutReplay implements idempotency.SharedCache.
func (c *Cache) PutReplay(ctx context.Context, rec *idempotency.Record, ttl time.Duration) {
	ttl = min(ttl, c.cfg.MaxTTL)
	if rec == nil || !rec.Status.Final() || rec.Snapshot == nil || ttl < time.Millisecond {
		return
	}
	b := encodeReplay(rec)
	if len(b) > c.cfg.MaxEntryBytes {
		return
	}
	call, ok := c.begin()
	if !ok {
		return
	}
	ctx, cancel := c.context(ctx)
	defer cancel()
	err := c.client.Set(ctx, c.redisKey("r:", rec.Scope, rec.Key), b, ttl).Err()
	c.end(call, err)
	if err == nil {
		c.stats.puts.Add(1)
	}
}

// MarkInFlight implements idempotency.SharedCache: SET NX GET with the TTL,
// one round trip that either sets the marker or returns the live one. A call
// that failed without an error reply may have set it, so it reports set: the
// marker's removal is then tried.
func (c *Cache) MarkInFlight(ctx context.Context, m idempotency.InFlightMarker, ttl time.Duration) (held *idempotency.InFlightMarker, set bool) {
	if c.cfg.DisableInFlightMarkers || ttl < time.Millisecond {
		return nil, false
	}
	call, ok := c.begin()
	if !ok {
		return nil, false // skipped: nothing set, nothing to remove
	}
	ctx, cancel := c.context(ctx)
	defer cancel()
	old, err := c.client.SetArgs(ctx, c.redisKey("m:", m.Scope, m.Key), encodeMarker(m),
		redis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Bytes()
	switch {
	case errors.Is(err, redis.Nil): // there was none: ours is set
		c.end(call, nil)
		c.stats.marked.Add(1)
		return nil, true
	case err != nil:
		c.end(call, err)
		return nil, classify(err) == failed
	}
	c.end(call, nil)
	held, err = decodeMarker(old, m.Scope, m.Key)
	if err != nil {
		c.stats.corrupt.Add(1)
		return nil, false // cannot tell: the database decides
	}
	c.stats.markerHeld.Add(1)
	return held, false
}

// unmarkScript deletes a marker only if it is still the caller's.
var unmarkScript = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// UnmarkInFlight implements idempotency.SharedCache. A marker that outlived
// its TTL and was replaced by another attempt's is left alone.
func (c *Cache) UnmarkInFlight(ctx context.Context, m idempotency.InFlightMarker) {
	// Tried even while Redis is marked down (one call, bounded by Timeout):
	// a marker left behind by a live owner would answer in-progress for a
	// finished key on every other instance until its lease ran out. The
	// middleware calls it only for a marker that MarkInFlight set (or may
	// have), so while Redis stays down requests do not call it at all.
	if c.cfg.DisableInFlightMarkers {
		return
	}
	call := c.health.current()
	ctx, cancel := c.context(ctx)
	defer cancel()
	err := unmarkScript.Run(ctx, c.client, []string{c.redisKey("m:", m.Scope, m.Key)}, encodeMarker(m)).Err()
	c.end(call, err)
}

// markUnlessReplayScript returns the replay under KEYS[1] and its PTTL
// ({1, replay, pttl}) and sets nothing; else, with ARGV[3] = "1", sets the
// marker ARGV[1] under KEYS[2] for ARGV[2] ms unless one is there ({3}),
// or returns the one there ({2, marker}); else {0}.
var markUnlessReplayScript = redis.NewScript(`
local r = redis.call("GET", KEYS[1])
if r then return {1, r, redis.call("PTTL", KEYS[1])} end
if ARGV[3] ~= "1" then return {0} end
local held = redis.call("GET", KEYS[2])
if held then return {2, held} end
redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[2])
return {3}`)

// MarkUnlessReplay implements idempotency.SharedCache: one script, one
// round trip, GetReplay and MarkInFlight at once. A call that failed
// without an error reply may have set the marker, so it reports set.
func (c *Cache) MarkUnlessReplay(ctx context.Context, m idempotency.InFlightMarker, ttl time.Duration) (rec *idempotency.Record, recTTL time.Duration, held *idempotency.InFlightMarker, set bool) {
	mark := !c.cfg.DisableInFlightMarkers && ttl >= time.Millisecond
	call, ok := c.begin()
	if !ok {
		return nil, 0, nil, false // skipped: nothing set, nothing to remove
	}
	ctx, cancel := c.context(ctx)
	defer cancel()
	flag := "0"
	if mark {
		flag = "1"
	}
	res, err := markUnlessReplayScript.Run(ctx, c.client,
		[]string{c.redisKey("r:", m.Scope, m.Key), c.redisKey("m:", m.Scope, m.Key)},
		encodeMarker(m), ttl.Milliseconds(), flag).Slice()
	if err != nil {
		c.end(call, err)
		c.stats.misses.Add(1)
		return nil, 0, nil, mark && classify(err) == failed
	}
	c.end(call, nil)
	kind, _ := res[0].(int64)
	if kind != 1 {
		c.stats.misses.Add(1)
	}
	switch kind {
	case 1:
		b, _ := res[1].(string)
		pttl, _ := res[2].(int64)
		rec, err := decodeReplay([]byte(b), m.Scope, m.Key)
		if err != nil {
			c.stats.corrupt.Add(1)
			c.stats.misses.Add(1)
			return nil, 0, nil, false
		}
		c.stats.hits.Add(1)
		return rec, max(0, time.Duration(pttl)*time.Millisecond), nil, false // -1 (no expiry: not ours) means unknown
	case 2:
		b, _ := res[1].(string)
		held, err := decodeMarker([]byte(b), m.Scope, m.Key)
		if err != nil {
			c.stats.corrupt.Add(1)
			return nil, 0, nil, false // cannot tell: the database decides
		}
		c.stats.markerHeld.Add(1)
		return nil, 0, held, false
	case 3:
		c.stats.marked.Add(1)
		return nil, 0, nil, true
	}
	return nil, 0, nil, false
}

// putAndUnmarkScript sets the replay ARGV[1] under KEYS[1] for ARGV[2] ms
// (when ARGV[1] is not empty), then deletes the marker under KEYS[2] if it
// is still ARGV[3].
var putAndUnmarkScript = redis.NewScript(`
if ARGV[1] ~= "" then redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2]) end
if redis.call("GET", KEYS[2]) == ARGV[3] then redis.call("DEL", KEYS[2]) end
return 0`)

// PutReplayAndUnmark implements idempotency.SharedCache: PutReplay and
// UnmarkInFlight in one script, one round trip. Tried even while Redis is
// marked down, as UnmarkInFlight is.
func (c *Cache) PutReplayAndUnmark(ctx context.Context, rec *idempotency.Record, ttl time.Duration, m idempotency.InFlightMarker) {
	if c.cfg.DisableInFlightMarkers {
		c.PutReplay(ctx, rec, ttl)
		return
	}
	var entry []byte
	ttl = min(ttl, c.cfg.MaxTTL)
	if rec != nil && rec.Status.Final() && rec.Snapshot != nil && ttl >= time.Millisecond {
		if b := encodeReplay(rec); len(b) <= c.cfg.MaxEntryBytes {
			entry = b
		}
	}
	call := c.health.current()
	ctx, cancel := c.context(ctx)
	defer cancel()
	err := putAndUnmarkScript.Run(ctx, c.client,
		[]string{c.redisKey("r:", m.Scope, m.Key), c.redisKey("m:", m.Scope, m.Key)},
		entry, ttl.Milliseconds(), encodeMarker(m)).Err()
	c.end(call, err)
	if err == nil && entry != nil {
		c.stats.puts.Add(1)
	}
}

// redisKey is Prefix, the SHA-256 of the scope and key, length-prefixed,
// in braces, and the kind ("r:" replay, "m:" marker): raw keys never reach
// Redis's key space, and each entry carries its scope and key to be checked
// on read. The braces are a hash tag: a key's replay and marker live in one
// hash slot of a Redis Cluster, so that one script may touch both.
func (c *Cache) redisKey(kind, scope, key string) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(scope)))
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return c.cfg.Prefix + "{" + hex.EncodeToString(h.Sum(nil)) + "}:" + kind
}

// context bounds a call by Config.Timeout, detached from the request's
// cancellation: a client that went away is not a Redis failure.
func (c *Cache) context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
}

// begin reports whether a call may go to Redis now (health.begin).
func (c *Cache) begin() (call, bool) { return c.health.begin(c.now()) }

// end records how a call ended, and logs the change of state it made, once.
func (c *Cache) end(cl call, err error) {
	ch := c.health.end(cl, c.now(), classify(err))
	switch {
	case ch.down:
		c.cfg.Logger.Warn("idemredis: Redis is down or slow; failing open to the database",
			"err", err, "was_up_for", ch.lasted, "next_probe_in", ch.backoff)
	case ch.up:
		c.cfg.Logger.Info("idemredis: Redis is reachable again; using it", "was_down_for", ch.lasted)
	}
}
