package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"
)

// respondToDuplicate is step 7: a request whose key is already held or
// finished. A different fingerprint is a conflict; a final record is
// replayed; a PROCESSING record is in progress (after waiting up to
// InFlightWait for it to finish).
func (a *attempt) respondToDuplicate(rec *Record) {
	if rec.Status == StatusProcessing && rec.Fingerprint == a.fingerprint && a.m.cfg.InFlightWait > 0 {
		rec = a.waitForFinal(rec)
	}
	switch {
	case rec.Fingerprint != a.fingerprint:
		a.m.log(slog.LevelInfo, "key reused with a different request", a.keyHash)
		a.reject(ErrFingerprintMismatch)
	case rec.Status.Final() && rec.Snapshot != nil:
		_, end := a.m.startStage(a.ctx, StageReplay)
		a.answerReplay(rec.Snapshot, cmp.Or(a.from, ReplayFromStore))
		end(StageEnd{Outcome: OutcomeReplayed, Record: rec.Status, KeyHash: a.keyHash})
		a.done(Event{Outcome: OutcomeReplayed, Status: rec.Snapshot.StatusCode, Replayed: rec.Status, From: cmp.Or(a.from, ReplayFromStore)})
	default:
		p := a.problem(ErrInProgress)
		a.answerProblem(p)
		a.done(Event{Outcome: OutcomeInProgress, Status: p.Status})
	}
}

// waitForFinal waits, within the attempt's wait (waitContext), for a
// PROCESSING record to become final. It wakes at once when the attempt runs
// on this instance and polls the store with backoff otherwise.
func (a *attempt) waitForFinal(rec *Record) *Record {
	ctx, cancel := a.waitContext()
	defer cancel()
	for poll := firstPoll; rec.Status == StatusProcessing; {
		if !a.nextLook(ctx, &poll) {
			return rec
		}
		next, err := a.lookup(ctx)
		if err != nil {
			return rec // released or unreadable: answer in-progress, the client retries
		}
		rec = next
	}
	return rec
}

// reject answers bad input (and conflicts) before anything is written.
func (a *attempt) reject(err error) {
	p := problemFor(err, a.m.cfg.ConflictStatus)
	a.answerProblem(p)
	outcome := OutcomeInvalid
	if errors.Is(err, ErrFingerprintMismatch) {
		outcome = OutcomeConflict
	}
	a.done(Event{Outcome: outcome, Status: p.Status})
}

// fail answers a store failure: 503 with Retry-After.
func (a *attempt) fail(outcome Outcome, err error) {
	p := a.problem(err)
	if outcome == OutcomeStoreError {
		a.m.log(slog.LevelError, "idempotency store failed", a.keyHash, "err", err)
	}
	a.answerProblem(p)
	a.done(Event{Outcome: outcome, Status: p.Status, Err: err})
}

// lookup reads the key's record with a fresh statement and caches it if it
// is final, for as long as the store says it lives.
func (a *attempt) lookup(ctx context.Context) (*Record, error) {
	rec, err := a.m.store.Lookup(ctx, a.scope, a.key)
	if err == nil && rec.Status.Final() && !rec.Expired {
		ttl := rec.ExpiresAt.Sub(rec.ReadAt)
		a.m.cache.put(rec, ttl-cacheMargin(ttl))
		a.putShared(rec, ttl-cacheMargin(ttl)) // Config.SharedCache (shared.go)
	}
	return rec, err
}

// cacheOwn caches a record this process just finished. The store computed
// its expiry at some moment after started, so the entry's clock starts there.
func (a *attempt) cacheOwn(st Status, snap *Snapshot, started time.Time) {
	ttl := a.m.cfg.Retention
	ttl -= cacheMargin(ttl) + time.Since(started)
	rec := &Record{Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint, Status: st, Snapshot: snap}
	a.m.cache.put(rec, ttl)
	a.putShared(rec, ttl) // Config.SharedCache (shared.go)
}

// snapshot keeps the status, the allow-listed headers and the body.
func (m *Middleware) snapshot(status int, header map[string][]string, body []byte) *Snapshot {
	kept := map[string][]string{}
	for _, name := range m.replayHeaders {
		if v := header[name]; len(v) > 0 {
			kept[name] = append([]string(nil), v...)
		}
	}
	return &Snapshot{StatusCode: status, Header: kept, Body: bytes.Clone(body)}
}
