// Package idemredis is an optional Redis pre-filter for the idempotency
// middleware: an idempotency.SharedCache that lets every instance of a
// service replay the snapshots any instance committed, and answer
// in-progress while any instance executes a key, without a database round
// trip.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
//	shared, err := idemredis.New(rdb, &idemredis.Config{Prefix: "orders:"})
//	if err != nil {
//		return err
//	}
//	mw, err := idempotency.New(store, &idempotency.Config{SharedCache: shared})
//
// Redis is never the source of truth. It may answer only what a stale or
// lost entry cannot make wrong:
//
//   - the replay of a final snapshot (DONE or FAILED) that is committed in the
//     database, written after the commit with a TTL shorter than the record's
//     remaining retention, and replayed only to a request whose scope, key
//     and fingerprint all match the entry (a different fingerprint goes on to
//     the database, which answers the conflict);
//   - in-progress with Retry-After, while another attempt's in-flight marker
//     (SET NX with the lease as TTL, owned by that attempt, deleted when it
//     has answered) carries the same fingerprint.
//
// Whether an attempt executes is decided by the database alone: a flushed,
// restarted or stopped Redis costs round trips, never a duplicate order.
// Entries carry a version tag and a checksum; one that does not decode, or
// names another scope or key, is a miss and is counted (Stats.Corrupt).
//
// Every call is bounded by Config.Timeout (20 ms by default): a slow or
// unreachable Redis is a miss and the request goes on to the database. The
// first failure marks Redis down (logged once); while down, calls skip
// Redis at no cost and one call per Config.ProbeInterval tries it again; the
// first answer marks it up (logged once). Stats counts all of it.
package idemredis
