package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// serveSinglePhase is steps 5 and 6 in ModeSinglePhase: there is no claim.
// The handler runs at once, and the finished record is inserted as the last
// statement of its transaction. A concurrent duplicate executes too, then
// blocks on the record's (or the order's) unique key until the first
// commits, fails, rolls back and replays the winner. A replay that misses
// the in-process cache (a retry that reached another instance) would do the
// same; while such retries are frequent on this route (replayHint), the
// record is read first instead, and a finished key is replayed without
// executing. New keys pay that read only then, or when the shared cache
// could not answer for this request (sharedBlind): with Redis answering the
// route's retries, the hint sees only new keys and stops reading, so while
// Redis is down or slow its retries would otherwise execute and roll back.
//
// With Config.InFlightWait, a duplicate of a key this instance is executing
// does not run beside it: it waits for that execution (awaitTwin) and
// replays its answer, as the collision would have made it do after a whole
// execution and rollback.
func (a *attempt) serveSinglePhase() {
	if a.m.cfg.InFlightWait > 0 {
		twin, done := a.m.inflight.enter(a.scope, a.key)
		if twin != nil {
			if a.awaitTwin(twin) {
				return
			}
			done = a.m.inflight.begin(a.scope, a.key)
		}
		defer done()
	}
	read := a.m.replayHint.request()
	if (read || a.sharedBlind) && a.answerFromRecord() {
		return
	}
	a.runSinglePhase()
}

// runSinglePhase is serveSinglePhase's executions, once the record was not
// read or said nothing: a batch's actions that fall back to one by one
// (batch.go) start here.
func (a *attempt) runSinglePhase() {
	for run := 1; a.executeSinglePhase(run < maxSinglePhaseRuns); run++ {
		// The database rolled the run back and no winner holds the key.
	}
	if a.renewing {
		// The key's record outlived its retention or its lease: renew the
		// key claim-first, after this execution's stages have ended.
		a.serveClaimFirst()
	}
}

// awaitTwin waits, up to InFlightWait, for this instance's execution of
// the key to end, then answers from what it left: the replay cache, else
// the record. It reports false, for the attempt to execute, when the twin
// left nothing (it failed or rolled back, or the read failed), or when
// the wait or the request ended first.
func (a *attempt) awaitTwin(twin <-chan struct{}) bool {
	a.m.inflight.twins.Add(1)
	defer a.m.inflight.twins.Add(-1)
	ctx, cancel := a.waitContext()
	defer cancel()
	select {
	case <-twin:
	case <-ctx.Done():
		return false
	}
	if rec := a.m.cache.get(a.scope, a.key); rec != nil {
		a.from = ReplayFromCache
		a.respondToDuplicate(rec)
		return true
	}
	return a.answerFromRecord()
}

// answerFromRecord reads the key's record before executing and answers
// from it when that is the answer executing would lead to: a final record is
// replayed (or refused for another fingerprint), a PROCESSING record under a
// live lease (a renewal in flight) is in progress, and a record past its
// retention or with an expired lease is renewed claim-first at once, as a
// collision with it would have been. It reports whether the attempt was
// answered. No record, or a failed read, leaves the decision to the
// execution: its INSERT still collides with a duplicate that commits
// meanwhile, so the read is never what makes a key execute once.
func (a *attempt) answerFromRecord() bool {
	rec, err := a.lookup(a.ctx)
	if err != nil {
		return false
	}
	a.m.replayHint.record()
	if a.mayTakeOver(rec) {
		a.mode, a.renewing = ModeClaimFirst, true
		a.serveClaimFirst()
		return true
	}
	a.respondToDuplicate(rec)
	return true
}

// replayHint tells a single-phase route whether to read the record before
// executing. Reading costs every request that misses the replay cache a
// primary-key SELECT: one round trip, which on a CPU-bound server took B1
// from 0.81 to 0.68 of the bare create's throughput (docs/benchmarks.md,
// "Fleet"). Not reading costs a retry of a finished key a whole execution,
// rolled back. So the route starts reading when, over a window of
// requests that missed the cache, at least one in replayReadFrom met
// an existing record (a read that found one, or an execution that collided
// with one), and stops when fewer than one in replayStopBelow did: retries
// that keep arriving on other instances are answered from the record, and
// with only new keys, as on a single instance whose cache answers its
// retries, nothing is read and single-phase keeps its one round trip over
// the bare handler (none on a pool from OpenMySQL or postgres.OpenDB,
// where the record's INSERT travels with the COMMIT: round trips per path
// are specified in roundtrips_internal_test.go). The gap between the two keeps a share of retries near
// the threshold from switching every window. A new process reads for its
// first window: its cache is empty, and after a restart retries are what
// arrives. It is a hint, never a decision: either way the record's INSERT
// decides who executes.
type replayHint struct {
	seen, found atomic.Int64
	skip        atomic.Bool // do not read first
}

const (
	replayHintWindow = 256 // requests that missed the cache, per decision
	replayReadFrom   = 50  // start reading when at least 1 in 50 met a record
	replayStopBelow  = 100 // stop when fewer than 1 in 100 did
)

// request counts a request that missed the replay cache and reports
// whether it should read the record first. Every replayHintWindow requests
// it decides again from the records met since the last decision.
func (h *replayHint) request() bool {
	if h.seen.Add(1)%replayHintWindow == 0 {
		found := h.found.Swap(0)
		if h.skip.Load() {
			h.skip.Store(found*replayReadFrom < replayHintWindow)
		} else {
			h.skip.Store(found*replayStopBelow < replayHintWindow)
		}
	}
	return !h.skip.Load()
}

// record counts a request that met an existing record.
func (h *replayHint) record() { h.found.Add(1) }

// maxSinglePhaseRuns bounds how often one single-phase request executes
// its handler when the database rolls the execution back (deadlock,
// certification conflict, snapshot conflict) and no winner holds the key.
// A single-phase handler only touches the database, so running it again
// is as safe as a client's retry, and cheaper for the client.
const maxSinglePhaseRuns = 3

// executeSinglePhase runs the handler once and answers, or reports that the
// database rolled the run back on a conflict that another run may not meet
// (again): then nothing was answered. mayRunAgain false answers such a
// conflict 503 with Retry-After instead.
func (a *attempt) executeSinglePhase(mayRunAgain bool) (again bool) {
	if a.lease.Owner == "" { // one owner for every run of this request
		a.lease = Lease{Scope: a.scope, Key: a.key, Owner: a.m.newOwner()}
	}
	// 5. Execute.
	res, err := a.runHandler()
	if err != nil {
		a.fail(OutcomeStoreError, err)
		return false
	}
	defer res.stop()

	// 6. Finalize.
	ctx, cancel := a.finalizeContext()
	defer cancel()
	ctx, end := a.m.startStage(ctx, StageFinalize)
	defer func() { end(StageEnd{Outcome: a.outcome, KeyHash: a.keyHash}) }()
	switch res.verdict(a.m.cfg.IsFinalFunc) {
	case verdictBroken:
		_ = res.tx.Rollback()
		if res.aborted {
			a.abort(res.panicked)
			return false
		}
		a.answerReleased(res.err(a.m.cfg.MaxSnapshotBytes))
	case verdictCommit:
		return a.commitSinglePhase(ctx, res, mayRunAgain)
	case verdictReject:
		_ = res.tx.Rollback()
		a.storeRejectionSinglePhase(ctx, res)
	case verdictRetry:
		// The handler may have failed because a concurrent duplicate won
		// (its order's unique key): then the winner's answer is the answer.
		_ = res.tx.Rollback()
		if a.answerWinner(ctx, false) {
			return false
		}
		a.answerWith(res.status, res.header, res.body)
		a.done(Event{Outcome: OutcomeReleased, Status: res.status})
	}
	return false
}

// commitSinglePhase inserts the DONE record as the transaction's last
// statement and commits. It reports again when the database rolled the
// transaction back on a conflict and no winner holds the key.
func (a *attempt) commitSinglePhase(ctx context.Context, res *handlerResult, mayRunAgain bool) (again bool) {
	started := time.Now()
	snap := a.m.snapshot(res.status, res.header, res.body)
	err := a.m.store.InsertFinal(ctx, res.tx, a.claimFor(), StatusDone, snap)
	if err != nil {
		_ = res.tx.Rollback()
		return a.insertFailed(ctx, err, mayRunAgain)
	}
	if err := res.tx.Commit(); err != nil {
		if errors.Is(err, ErrKeyClaimed) || answered(err) {
			// The server refused the COMMIT, or the record's INSERT that
			// a store sent with it (postgres.OpenDB's and OpenMySQL's
			// pools do): nothing committed, as when the INSERT fails on
			// its own.
			return a.insertFailed(ctx, err, mayRunAgain)
		}
		a.resolveSinglePhaseCommit(ctx, res, snap, err)
		return false
	}
	a.cacheOwn(StatusDone, snap, started)
	a.answerWith(snap.StatusCode, res.header, snap.Body)
	a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
	return false
}

// insertFailed answers a record INSERT (or a COMMIT) that the database
// refused, the business transaction rolled back: a taken key is answered by
// its record, a conflict with a concurrent duplicate by afterRollback, any
// other refusal as nothing recorded.
func (a *attempt) insertFailed(ctx context.Context, err error, mayRunAgain bool) (again bool) {
	switch {
	case errors.Is(err, ErrKeyClaimed):
		if a.answerWinner(ctx, true) {
			return false
		}
	case IsTransient(err):
		// A deadlock or a cluster's certification conflict with a
		// concurrent duplicate: if it won, its record is the answer.
		return a.afterRollback(ctx, err, mayRunAgain)
	}
	a.note(Event{Outcome: OutcomeStoreError, Err: err})
	a.answerReleased(err)
	return false
}

// resolveSinglePhaseCommit decides what a COMMIT did that failed without
// the server's answer (a server's answer, such as a deadlock or a
// certification conflict at COMMIT, committed nothing: see
// commitSinglePhase). A dropped connection leaves the outcome unknown: our
// record on a fresh read means the commit landed; another's means we lost
// to a duplicate; none means we cannot tell yet (the commit may still
// land), so the client is asked to retry, and the retry sees the truth: its
// own insert waits on ours.
func (a *attempt) resolveSinglePhaseCommit(ctx context.Context, res *handlerResult, snap *Snapshot, commitErr error) {
	rec, err := a.lookup(ctx)
	switch {
	case err == nil && rec.Owner == a.lease.Owner:
		a.answerWith(snap.StatusCode, res.header, snap.Body)
		a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
	case err == nil:
		a.respondToDuplicate(rec)
	default:
		a.fail(OutcomeUnknown, fmt.Errorf("%w: commit: %v; re-read: %v", ErrCommitUnknown, commitErr, err))
	}
}

// afterRollback answers a single-phase run that the database rolled back on
// a conflict: with the winner's record when a concurrent duplicate won,
// else by running again (see maxSinglePhaseRuns), else 503 with
// Retry-After.
func (a *attempt) afterRollback(ctx context.Context, cause error, mayRunAgain bool) (again bool) {
	a.note(Event{Outcome: OutcomeCollided, Err: cause})
	rec, err := a.lookup(ctx)
	switch {
	case err == nil && !a.mayTakeOver(rec):
		a.respondToDuplicate(rec)
		return false
	case (err == nil || errors.Is(err, ErrRecordNotFound)) && mayRunAgain:
		a.m.log(slog.LevelInfo, "rolled back by the database; running again", a.keyHash, "err", cause)
		return true
	case err == nil || errors.Is(err, ErrRecordNotFound):
		a.answerReleased(cause)
	default:
		a.fail(OutcomeStoreError, fmt.Errorf("%w; then: %w", cause, err))
	}
	return false
}

// storeRejectionSinglePhase stores a final non-2xx in autocommit, unless a
// record already holds the key (a concurrent winner, or a finished key whose
// replay missed the cache): then that record is the answer. A rejection
// that could be neither stored nor checked against a winner is answered 503
// with Retry-After, not passed on: in single-phase it may be the symptom of
// a concurrent winner (its order's unique key) rather than the answer, and
// the retry decides again. An INSERT whose reply was lost may have stored
// it: resolveRejection reads the record before anything is answered.
func (a *attempt) storeRejectionSinglePhase(ctx context.Context, res *handlerResult) {
	started := time.Now()
	snap := a.m.snapshot(res.status, res.header, res.body)
	err := a.m.store.InsertFinal(ctx, nil, a.claimFor(), StatusFailed, snap)
	switch {
	case errors.Is(err, ErrKeyClaimed):
		if a.answerWinner(ctx, true) {
			return
		}
		a.fail(OutcomeStoreError, fmt.Errorf("idempotency: rejection met a record that could not be read: %w", err))
		return
	case err != nil && replyLost(err):
		a.resolveRejection(ctx, res, snap, err)
		return
	case err != nil:
		a.fail(OutcomeStoreError, fmt.Errorf("idempotency: store rejection: %w", err))
		return
	default:
		a.cacheOwn(StatusFailed, snap, started)
	}
	a.answerWith(snap.StatusCode, res.header, snap.Body)
	a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
}

// resolveRejection decides what a rejection's INSERT did when its reply was
// lost: the statement may have landed, or may still land. Our record on a
// fresh read means it landed, and the rejection is the answer; another's
// (a concurrent winner) is the answer; none, or an unreadable key, leaves
// the outcome unknown, so the client is told so rather than that nothing
// was recorded, and the retry's own INSERT learns the truth.
func (a *attempt) resolveRejection(ctx context.Context, res *handlerResult, snap *Snapshot, insertErr error) {
	rec, err := a.lookup(ctx)
	switch {
	case err == nil && rec.Owner == a.lease.Owner:
		a.answerWith(snap.StatusCode, res.header, snap.Body)
		a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
	case err == nil && !a.mayTakeOver(rec):
		a.respondToDuplicate(rec)
	default:
		a.fail(OutcomeUnknown, fmt.Errorf("%w: store rejection: %v; re-read: %v", ErrCommitUnknown, insertErr, err))
	}
}

// answerWinner answers with the key's record if one exists now, and reports
// whether it did; collided says our INSERT met a record. A record past its
// retention makes the key new again, and one whose lease expired (a renewal
// that died) may be taken over, but single-phase's INSERT collides with any
// record: then the attempt is marked renewing and answered later by
// serveSinglePhase, the claim-first way, whose takeover is fenced, so two
// requests renewing one key cannot both win. So is a record that vanished
// after we collided with it (purged, or released by a failed renewal). This
// attempt's execution was rolled back, as a collision's always is.
func (a *attempt) answerWinner(ctx context.Context, collided bool) bool {
	rec, err := a.lookup(ctx)
	if err == nil {
		a.m.replayHint.record()
	}
	switch {
	case collided && errors.Is(err, ErrRecordNotFound):
		a.mode, a.renewing = ModeClaimFirst, true
		return true
	case err != nil:
		return false
	case a.mayTakeOver(rec):
		a.mode, a.renewing = ModeClaimFirst, true
		return true
	}
	a.note(Event{Outcome: OutcomeCollided})
	a.respondToDuplicate(rec)
	return true
}

func (a *attempt) claimFor() Claim {
	return Claim{Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint, Owner: a.lease.Owner, Retention: a.m.cfg.Retention}
}
