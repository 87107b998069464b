package idempotency

import (
	"context"
	"time"
)

// SharedCache is an optional pre-filter shared by every instance of a
// service (Redis, in package github.com/orderguard/idempotency/redis), in
// front of the Store. It is never the source of truth: it may only produce
// answers that a stale or lost entry cannot make wrong, namely the replay of
// a committed snapshot with the same scope, key and fingerprint, and an
// in-progress answer with Retry-After. Whether an attempt executes is
// decided by the Store alone, so a cache that is flushed, stopped, slow or
// holds garbage costs database round trips, never a duplicate order.
//
// Implementations must be safe for concurrent use and must fail open: a
// failure or a timeout is a miss (nil), never an error on the request path.
// An implementation that also reports its health implements
// SharedCacheHealthReporter.
type SharedCache interface {
	// GetReplay returns the final record cached for scope and key, with how
	// much longer it may be trusted (0 if unknown), or nil on a miss. The
	// middleware replays it only if its scope, key and fingerprint match the
	// request's and it is final with a snapshot; anything else falls
	// through to the Store, which decides (a different fingerprint is never
	// answered as a conflict from the cache).
	GetReplay(ctx context.Context, scope, key string) (*Record, time.Duration)

	// PutReplay caches a final record that is committed in the Store, for at
	// most ttl, which ends before the record's retention does.
	PutReplay(ctx context.Context, rec *Record, ttl time.Duration)

	// MarkInFlight marks m's scope and key as executing by m.Owner for ttl,
	// unless a live marker exists: then it sets nothing and returns that
	// marker. set reports whether m was set, or may have been (a call that
	// failed once it could have reached the cache); a nil marker and set
	// false mean the cache could not tell and set nothing (it was skipped).
	MarkInFlight(ctx context.Context, m InFlightMarker, ttl time.Duration) (held *InFlightMarker, set bool)

	// UnmarkInFlight removes m's marker if m.Owner still holds it. The
	// middleware calls it (or PutReplayAndUnmark) once the attempt has
	// answered, for each marking that reported set, and only then.
	UnmarkInFlight(ctx context.Context, m InFlightMarker)

	// MarkUnlessReplay is GetReplay and MarkInFlight in one atomic call,
	// the first a request makes when it misses the in-process cache: a
	// replay cached for m's scope and key is returned as GetReplay returns
	// it, and nothing is set; otherwise rec is nil and the rest is
	// MarkInFlight's answer. So a new key costs one round trip before it
	// executes.
	MarkUnlessReplay(ctx context.Context, m InFlightMarker, ttl time.Duration) (rec *Record, recTTL time.Duration, held *InFlightMarker, set bool)

	// PutReplayAndUnmark is PutReplay (when rec is not nil) and then
	// UnmarkInFlight in one call: how an attempt that set its marker ends,
	// so that its finish costs one round trip, and another instance never
	// sees the marker gone before the replay is there.
	PutReplayAndUnmark(ctx context.Context, rec *Record, ttl time.Duration, m InFlightMarker)
}

// InFlightMarker says that an attempt is executing a key somewhere in the
// fleet. Owner identifies the attempt, so that only it removes its marker;
// a marker whose owner died expires after the Lease.
type InFlightMarker struct {
	Scope, Key, Fingerprint, Owner string
}

// SharedCacheHealth is a SharedCache's account of its own state since it
// was created, for metrics (package metrics, WithSharedCache) and health
// checks. Every call it counts as FailOpens or Skipped was a miss: the
// request went on to the Store, and the client never saw an error.
type SharedCacheHealth struct {
	Up        bool   // calls go to the cache; false while it is down and calls skip it
	FailOpens uint64 // calls that failed or timed out
	Skipped   uint64 // calls not made because the cache was down
	Downs     uint64 // changes of state from up to down
	Ups       uint64 // changes of state from down to up
}

// SharedCacheHealthReporter is implemented by a SharedCache that reports
// its health (idemredis.Cache does).
type SharedCacheHealthReporter interface {
	Health() SharedCacheHealth
}

// preFilter consults Config.SharedCache between the in-process cache and the
// Store, in one call (MarkUnlessReplay). It answers a replay of a matching
// committed snapshot. Otherwise it marks the key as executing by this
// attempt and returns the function that removes the marker once the
// attempt has answered, in one call with the replay the attempt leaves
// (putShared). When another attempt's
// live marker carries the same fingerprint, the request waits for that
// attempt's outcome if InFlightWait allows (awaitMarker), and otherwise, or
// if the marker outlives the wait, is answered in-progress: without
// waiting, in single-phase, the duplicate would execute. A marker with
// another fingerprint, or one that vanished without an outcome, leaves the
// decision to the Store. A call that failed or was skipped (the cache down
// or slow) marks the attempt sharedBlind.
func (a *attempt) preFilter() (unmark func(), answered bool) {
	sc := a.m.cfg.SharedCache
	if sc == nil {
		return func() {}, false
	}
	misses := sharedMisses(sc)
	m := InFlightMarker{Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint, Owner: a.m.newOwner()}
	held, set, replayed := a.markUnlessReplay(a.ctx, sc, m)
	if replayed {
		return nil, true
	}
	if held != nil && held.Fingerprint == a.fingerprint && a.m.cfg.InFlightWait > 0 {
		if held, set, answered = a.awaitMarker(sc, m, held); answered {
			return nil, true
		}
	}
	a.sharedBlind = sharedMisses(sc) != misses
	switch {
	case set:
		a.sharedMarked = true
		return func() {
			a.sharedMarked = false
			sc.PutReplayAndUnmark(context.WithoutCancel(a.ctx), a.sharedPut, a.sharedPutTTL, m)
		}, false
	case held == nil:
		return func() {}, false // the cache could not tell: the Store decides
	case held.Fingerprint == a.fingerprint:
		p := a.problem(ErrInProgress)
		a.answerProblem(p)
		a.done(Event{Outcome: OutcomeInProgress, Status: p.Status})
		return nil, true
	}
	return func() {}, false // another request's marker: the Store decides
}

// sharedMisses counts the calls of a SharedCache that reports its health
// which failed or were skipped; 0 for one that does not report it. A
// change across a request's calls means the cache may have missed a replay
// it holds, or never been asked: a finished key cannot be told from a new
// one there (the count is the cache's, so a concurrent request's failure
// also counts: pessimistic, and only while the cache fails).
func sharedMisses(sc SharedCache) uint64 {
	r, ok := sc.(SharedCacheHealthReporter)
	if !ok {
		return 0
	}
	h := r.Health()
	return h.FailOpens + h.Skipped
}

// replayable reports whether rec, from the shared cache, may answer this
// request: the same scope, key and fingerprint, final, with a snapshot.
func (a *attempt) replayable(rec *Record) bool {
	return rec != nil && rec.Scope == a.scope && rec.Key == a.key && rec.Fingerprint == a.fingerprint &&
		rec.Status.Final() && rec.Snapshot != nil
}

// markUnlessReplay answers with the shared cache's replay of the key, if it
// holds one this request may be answered with (replayed), and otherwise
// reports how marking m went, as MarkInFlight does. A replay it may not
// answer with (another fingerprint, not final) sets no marker: the key is
// finished, and the Store decides.
func (a *attempt) markUnlessReplay(ctx context.Context, sc SharedCache, m InFlightMarker) (held *InFlightMarker, set, replayed bool) {
	rec, ttl, held, set := sc.MarkUnlessReplay(ctx, m, a.m.cfg.Lease)
	if !a.replayable(rec) {
		return held, set, false
	}
	a.m.cache.put(rec, ttl-cacheMargin(ttl))
	a.from = ReplayFromShared
	a.respondToDuplicate(rec)
	return nil, set, true
}

// awaitMarker waits, within the attempt's wait (waitContext), for the
// attempt whose marker (held) holds the key to finish, as waitForFinal
// waits for a PROCESSING record: it wakes at once when that attempt runs on
// this instance, and otherwise looks again with backoff. Each look reads
// this instance's cache and the shared cache's replay, whoever holds the
// marker, then tries to set this attempt's marker m, which succeeds once
// the marker is gone. An answer found is replayed. Otherwise it returns the
// marker that holds the key when the wait ended, or nil when the marker
// vanished without an answer: then m is set (as MarkInFlight reports it),
// or the cache cannot tell, and the Store decides.
func (a *attempt) awaitMarker(sc SharedCache, m InFlightMarker, held *InFlightMarker) (_ *InFlightMarker, set, answered bool) {
	ctx, cancel := a.waitContext()
	defer cancel()
	for poll := firstPoll; held != nil && held.Fingerprint == a.fingerprint; {
		if !a.nextLook(ctx, &poll) {
			return held, false, false
		}
		if a.replayCached() {
			return nil, false, true
		}
		if held, set, answered = a.markUnlessReplay(ctx, sc, m); answered {
			return nil, false, true
		}
	}
	if held != nil {
		return held, false, false // another request's marker
	}
	// The marker's owner removes it with the call that caches its answer,
	// so an answer it had was there for markUnlessReplay, or is in this
	// instance's cache now.
	if a.replayCached() {
		if set {
			sc.UnmarkInFlight(context.WithoutCancel(a.ctx), m)
		}
		return nil, false, true
	}
	return nil, set, false
}

// replayCached answers from this instance's cache, if it holds the key.
func (a *attempt) replayCached() bool {
	rec := a.m.cache.get(a.scope, a.key)
	if rec == nil {
		return false
	}
	a.from = ReplayFromCache
	a.respondToDuplicate(rec)
	return true
}

// putShared offers a final record, committed in the Store, to
// Config.SharedCache: with the call that removes the attempt's in-flight
// marker when it set one (see preFilter), else at once.
func (a *attempt) putShared(rec *Record, ttl time.Duration) {
	if a.sharedMarked {
		if ttl > 0 {
			a.sharedPut, a.sharedPutTTL = rec, ttl
		}
		return
	}
	a.m.putShared(rec, ttl)
}

// putShared offers a final record, committed in the Store, to
// Config.SharedCache.
func (m *Middleware) putShared(rec *Record, ttl time.Duration) {
	if m.cfg.SharedCache != nil && ttl > 0 {
		m.cfg.SharedCache.PutReplay(context.Background(), rec, ttl)
	}
}
