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
	// marker. It returns nil when it set the marker or could not tell.
	MarkInFlight(ctx context.Context, m InFlightMarker, ttl time.Duration) *InFlightMarker

	// UnmarkInFlight removes m's marker if m.Owner still holds it.
	UnmarkInFlight(ctx context.Context, m InFlightMarker)
}

// InFlightMarker says that an attempt is executing a key somewhere in the
// fleet. Owner identifies the attempt, so that only it removes its marker;
// a marker whose owner died expires after the Lease.
type InFlightMarker struct {
	Scope, Key, Fingerprint, Owner string
}

// preFilter consults Config.SharedCache between the in-process cache and the
// Store. It answers a replay of a matching committed snapshot, or
// in-progress when another attempt's live marker carries the same
// fingerprint and the request would not wait (InFlightWait 0, or
// single-phase, where the duplicate would otherwise execute). Otherwise it
// marks the key as executing by this attempt and returns the function that
// removes the marker once the attempt has answered.
func (a *attempt) preFilter() (unmark func(), answered bool) {
	sc := a.m.cfg.SharedCache
	if sc == nil {
		return func() {}, false
	}
	if rec, ttl := sc.GetReplay(a.ctx, a.scope, a.key); rec != nil &&
		rec.Scope == a.scope && rec.Key == a.key && rec.Fingerprint == a.fingerprint &&
		rec.Status.Final() && rec.Snapshot != nil {
		a.m.cache.put(rec, ttl-cacheMargin(ttl))
		a.respondToDuplicate(rec)
		return nil, true
	}
	m := InFlightMarker{Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint, Owner: a.m.newOwner()}
	held := sc.MarkInFlight(a.ctx, m, a.m.cfg.Lease)
	switch {
	case held == nil:
		return func() { sc.UnmarkInFlight(context.WithoutCancel(a.ctx), m) }, false
	case held.Fingerprint == a.fingerprint && (a.m.cfg.InFlightWait == 0 || a.mode == ModeSinglePhase):
		p := a.problem(ErrInProgress)
		WriteProblem(a.w, p)
		a.done(Event{Outcome: OutcomeInProgress, Status: p.Status})
		return nil, true
	}
	return func() {}, false // another attempt's marker: the Store decides
}

// putShared offers a final record, committed in the Store, to
// Config.SharedCache.
func (m *Middleware) putShared(rec *Record, ttl time.Duration) {
	if m.cfg.SharedCache != nil && ttl > 0 {
		m.cfg.SharedCache.PutReplay(context.Background(), rec, ttl)
	}
}
