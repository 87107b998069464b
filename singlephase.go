package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// serveSinglePhase is steps 4–7 in ModeSinglePhase: look the key up instead
// of claiming it, execute, and insert the finished record as the last
// statement of the business transaction. A concurrent duplicate executes
// too, then blocks on the record's (or the order's) unique key until the
// first commits, fails, rolls back and replays the winner.
func (a *attempt) serveSinglePhase() {
	// 4. Look up.
	ctx, end := a.m.startStage(a.ctx, StageClaim)
	rec, err := a.lookup(ctx)
	switch {
	case err == nil && rec.Expired:
		// Past retention the key is new. If another request forgets or
		// replaces the record first, our insert collides and we replay it.
		if err := a.m.store.Forget(ctx, a.scope, a.key, rec.Version); err != nil && !errors.Is(err, ErrLeaseLost) {
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			a.fail(OutcomeStoreError, err)
			return
		}
	case err == nil:
		end(StageEnd{Record: rec.Status})
		a.respondToDuplicate(rec)
		return
	case !errors.Is(err, ErrRecordNotFound):
		end(StageEnd{Outcome: OutcomeStoreError, Err: err})
		a.fail(OutcomeStoreError, err)
		return
	}
	end(StageEnd{})

	// 5. Execute.
	a.lease = Lease{Scope: a.scope, Key: a.key, Owner: a.m.newOwner()}
	ctx, exec, stop := a.detach()
	defer stop()
	res, err := a.runHandler(ctx, exec)
	if err != nil {
		a.fail(OutcomeStoreError, err)
		return
	}

	// 6. Finalize.
	ctx, endFinalize := a.m.startStage(ctx, StageFinalize)
	defer func() { endFinalize(StageEnd{Outcome: a.outcome, KeyHash: a.keyHash}) }()
	switch res.verdict(a.m.cfg.IsFinalFunc) {
	case verdictBroken:
		_ = res.tx.Rollback()
		if res.panicked == http.ErrAbortHandler {
			a.done(Event{Outcome: OutcomeReleased, Err: http.ErrAbortHandler})
			panic(res.panicked) // net/http aborts the response, as the handler asked
		}
		a.answerReleased(res.err(a.m.cfg.MaxSnapshotBytes))
	case verdictCommit:
		a.commitSinglePhase(ctx, res)
	case verdictReject:
		_ = res.tx.Rollback()
		a.storeRejectionSinglePhase(ctx, res)
	case verdictRetry:
		// The handler may have failed because a concurrent duplicate won
		// (its order's unique key): then the winner's answer is the answer.
		_ = res.tx.Rollback()
		if a.answerWinner(ctx) {
			return
		}
		writeResponse(a.w, res.status, res.header, res.body)
		a.done(Event{Outcome: OutcomeReleased, Status: res.status})
	}
}

// commitSinglePhase inserts the DONE record as the transaction's last
// statement and commits.
func (a *attempt) commitSinglePhase(ctx context.Context, res *handlerResult) {
	snap := a.m.snapshot(res.status, res.header, res.body)
	lease, err := a.m.store.InsertFinal(ctx, res.tx, a.claimFor(), StatusDone, snap)
	if err != nil {
		_ = res.tx.Rollback()
		if errors.Is(err, ErrKeyClaimed) && a.answerWinner(ctx) {
			return
		}
		a.answerReleased(err)
		return
	}
	if err := res.tx.Commit(); err != nil {
		a.resolveSinglePhaseCommit(ctx, lease, res, snap, err)
		return
	}
	a.m.cacheOwn(a.scope, a.key, a.fingerprint, StatusDone, snap)
	writeResponse(a.w, snap.StatusCode, res.header, snap.Body)
	a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
}

// resolveSinglePhaseCommit: our record on a fresh read means the commit
// landed; another's means we lost to a duplicate; none means we cannot tell
// yet (the commit may still land), so the client is asked to retry, and the
// retry sees the truth.
func (a *attempt) resolveSinglePhaseCommit(ctx context.Context, lease Lease, res *handlerResult, snap *Snapshot, commitErr error) {
	rec, err := a.lookup(ctx)
	switch {
	case err == nil && rec.Owner == lease.Owner:
		writeResponse(a.w, snap.StatusCode, res.header, snap.Body)
		a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
	case err == nil:
		a.respondToDuplicate(rec)
	default:
		a.fail(OutcomeUnknown, fmt.Errorf("%w: commit: %v; re-read: %v", ErrCommitUnknown, commitErr, err))
	}
}

// storeRejectionSinglePhase stores a final non-2xx in autocommit, unless a
// concurrent duplicate already finished the key.
func (a *attempt) storeRejectionSinglePhase(ctx context.Context, res *handlerResult) {
	snap := a.m.snapshot(res.status, res.header, res.body)
	_, err := a.m.store.InsertFinal(ctx, nil, a.claimFor(), StatusFailed, snap)
	switch {
	case errors.Is(err, ErrKeyClaimed):
		if a.answerWinner(ctx) {
			return
		}
	case err != nil:
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
	default:
		a.m.cacheOwn(a.scope, a.key, a.fingerprint, StatusFailed, snap)
	}
	writeResponse(a.w, snap.StatusCode, res.header, snap.Body)
	a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
}

// answerWinner answers with the key's record if one exists now, and reports
// whether it did.
func (a *attempt) answerWinner(ctx context.Context) bool {
	rec, err := a.lookup(ctx)
	if err != nil {
		return false
	}
	a.note(Event{Outcome: OutcomeCollided})
	a.respondToDuplicate(rec)
	return true
}

func (a *attempt) claimFor() Claim {
	return Claim{Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint, Owner: a.lease.Owner, Retention: a.m.cfg.Retention}
}
