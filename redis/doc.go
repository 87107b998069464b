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
//     (set only where none is, with the lease as TTL, owned by that
//     attempt, deleted when it has answered) carries the same fingerprint.
//
// A request makes at most one Redis call before the database and one after
// its answer: a script that returns the replay, or else sets the
// attempt's marker (MarkUnlessReplay), and one that writes the replay and
// removes the marker (PutReplayAndUnmark). A key's replay and marker share
// a hash tag, so both scripts run on a Redis Cluster too. A replay answered
// from Redis is its one call.
//
// Whether an attempt executes is decided by the database alone: a flushed,
// restarted or stopped Redis costs round trips, never a duplicate order.
// Entries carry a version tag and a checksum; one that does not decode, or
// names another scope or key, is a miss and is counted (Stats.Corrupt).
//
// A duplicate that finds another attempt's marker with the same fingerprint
// waits for that attempt's outcome when idempotency.Config.InFlightWait is
// set: it polls Redis (and this instance's cache) with backoff, up to
// InFlightWait and no longer than the request, and replays the snapshot
// once it is there; a marker that vanishes without one leaves the decision
// to the database; a marker still held when the wait ends is answered
// in-progress. The wait itself reads only Redis and this instance's memory.
//
// Every call is bounded by Config.Timeout (20 ms by default): a slow or
// unreachable Redis is a miss and the request goes on to the database.
// Redis is marked down once calls have failed for Timeout with no answer in
// between, so that a stray slow call or a pause of the process is not an
// outage. While down, calls skip Redis at no cost; after
// Config.ProbeInterval one call, the probe, tries it, and only a probe's
// answer marks Redis up again. Failed probes, and going down again soon
// after coming back, double the wait up to Config.MaxProbeInterval, so a
// restart under load is one change down and one up, each logged once.
// Stats and Health count all of it; package metrics exports Health
// (metrics.WithSharedCache).
package idemredis
