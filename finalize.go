package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// finalize is step 6, by the handler's verdict. It runs on a context of its
// own (finalizeContext): the handler's deadline may have passed, and fencing,
// not the deadline, keeps a late finalize from harming a successor.
func (a *attempt) finalize(res *handlerResult) {
	ctx, cancel := a.finalizeContext()
	defer cancel()
	ctx, end := a.m.startStage(ctx, StageFinalize)
	defer func() { end(StageEnd{Outcome: a.outcome, KeyHash: a.keyHash}) }()

	a.lease = res.exec.currentLease() // as the handler's heartbeats left it
	switch res.verdict(a.m.cfg.IsFinalFunc) {
	case verdictBroken:
		_ = res.tx.Rollback()
		if res.aborted {
			_ = a.m.store.Release(ctx, a.lease)
			a.abort(res.panicked)
			return
		}
		a.releaseAndAnswer(ctx, res.err(a.m.cfg.MaxSnapshotBytes))
	case verdictCommit:
		a.commit(ctx, res.tx, res.header, a.m.snapshot(res.status, res.header, res.body))
	case verdictReject:
		_ = res.tx.Rollback()
		a.storeRejection(ctx, res.header, a.m.snapshot(res.status, res.header, res.body))
	case verdictRetry:
		_ = res.tx.Rollback()
		a.releaseAndPassThrough(ctx, res.status, res.header, res.body)
	}
}

// finalizeTimeout bounds finalizing: the fenced writes, COMMIT and any
// re-reads that decide an unknown outcome.
const finalizeTimeout = 10 * time.Second

// finalizeContext is detached from the client (see runHandler) and from the
// handler's deadline.
func (a *attempt) finalizeContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(a.ctx), finalizeTimeout)
}

// commit is step 6 for a 2xx: finish the record with the snapshot inside the
// business transaction, then commit. The order rows and the snapshot commit
// together or not at all; the client hears nothing before the commit.
func (a *attempt) commit(ctx context.Context, tx *sql.Tx, header map[string][]string, snap *Snapshot) {
	started := time.Now()
	finished, err := a.m.store.FinishTx(ctx, tx, a.lease, StatusDone, snap, a.m.cfg.Retention)
	if err != nil {
		_ = tx.Rollback()
		if errors.Is(err, ErrLeaseLost) {
			a.answerCurrentOwner(ctx, err)
			return
		}
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		a.releaseAndAnswer(ctx, err)
		return
	}
	if err := tx.Commit(); err != nil {
		a.resolveCommit(ctx, finished, header, snap, err)
		return
	}
	a.cacheOwn(StatusDone, snap, started)
	a.answerWith(snap.StatusCode, header, snap.Body)
	a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
}

// resolveCommit decides what a failed COMMIT did. A dropped connection
// leaves the outcome unknown (the server may even still be committing), so
// the record is read again on a fresh connection: finished by our lease means
// the order committed. Still held by our lease proves nothing yet, because
// the commit may become visible a moment later; only a fenced release that
// actually deletes the claim proves the order did not commit. Anything else
// means another attempt owns the key now.
func (a *attempt) resolveCommit(ctx context.Context, finished Lease, header map[string][]string, snap *Snapshot, commitErr error) {
	unknown := func(err error) {
		// The key stays claimed until its lease expires, so a retry can
		// never execute twice, and then learns the real outcome.
		err = fmt.Errorf("%w: commit: %v; then: %v", ErrCommitUnknown, commitErr, err)
		a.m.log(slog.LevelError, "commit outcome unknown", a.keyHash, "err", err)
		a.fail(OutcomeUnknown, err)
	}
	for range 2 {
		rec, err := a.lookup(ctx)
		switch {
		case err != nil && !errors.Is(err, ErrRecordNotFound):
			unknown(err)
			return
		case err == nil && rec.Status.Final() && rec.Owner == finished.Owner && rec.Version == finished.Version:
			a.m.log(slog.LevelWarn, "commit reported an error but had committed", a.keyHash, "err", commitErr)
			a.answerWith(snap.StatusCode, header, snap.Body)
			a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
			return
		case err == nil && rec.Status == StatusProcessing && rec.Owner == a.lease.Owner && rec.Version == a.lease.Version:
			err := a.m.store.Release(ctx, a.lease)
			if err == nil {
				a.answerReleased(fmt.Errorf("idempotency: commit failed, key released: %w", commitErr))
				return
			}
			if !errors.Is(err, ErrLeaseLost) {
				unknown(err)
				return
			}
			// The release matched nothing: the commit landed meanwhile, or
			// someone took over. Read again.
		default:
			a.answerCurrentOwner(ctx, fmt.Errorf("idempotency: commit: %w", commitErr))
			return
		}
	}
	unknown(errors.New("the record kept changing"))
}

// storeRejection is step 6 for a final non-2xx (a business rejection such as
// an unknown SKU): the business transaction is already rolled back; the
// answer is stored as FAILED so that every retry gets it again.
func (a *attempt) storeRejection(ctx context.Context, header map[string][]string, snap *Snapshot) {
	started := time.Now()
	_, err := a.m.store.Finish(ctx, a.lease, StatusFailed, snap, a.m.cfg.Retention)
	switch {
	case errors.Is(err, ErrLeaseLost):
		a.answerCurrentOwner(ctx, err)
		return
	case err != nil:
		// The rejection is the true answer and nothing was written, so the
		// client still gets it; the key is released so that a retry decides
		// again rather than waiting out the lease. A release that matches
		// nothing says otherwise: our Finish landed after all (its reply was
		// lost), or the handler outlived the lease and a duplicate took the
		// key over and may have committed the order. The record says which
		// (found by the model: model/README.md, S3).
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		if rerr := a.m.store.Release(ctx, a.lease); errors.Is(rerr, ErrLeaseLost) {
			a.rejectionOrOwner(ctx, header, snap, fmt.Errorf("idempotency: store rejection: %w; release: %w", err, rerr))
			return
		}
		a.m.log(slog.LevelError, "could not store a rejection; key released", a.keyHash, "err", err)
	default:
		a.cacheOwn(StatusFailed, snap, started)
	}
	a.answerWith(snap.StatusCode, header, snap.Body)
	a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
}

// rejectionOrOwner answers a rejection whose Finish failed and whose
// release matched nothing: our FAILED record means the Finish landed (its
// reply lost) and the rejection is the answer, as stored; any other record
// is another attempt's, and the answer is its.
func (a *attempt) rejectionOrOwner(ctx context.Context, header map[string][]string, snap *Snapshot, cause error) {
	rec, err := a.lookup(ctx)
	if err == nil && rec.Status == StatusFailed && rec.Owner == a.lease.Owner {
		a.answerWith(snap.StatusCode, header, snap.Body)
		a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
		return
	}
	a.answerCurrentOwner(ctx, cause)
}

// releaseAndPassThrough handles a non-final status (5xx by default): nothing
// is stored and the key is released, so a retry executes again. The client
// gets the handler's own answer.
func (a *attempt) releaseAndPassThrough(ctx context.Context, status int, header map[string][]string, body []byte) {
	err := a.m.store.Release(ctx, a.lease)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
	}
	a.m.log(slog.LevelWarn, "handler failed; key released", a.keyHash, "status", status, "release_err", err)
	a.answerWith(status, header, body)
	a.done(Event{Outcome: OutcomeReleased, Status: status})
}

// releaseAndAnswer ends an attempt that failed after its claim: the key is
// released (fenced, so a late attempt never deletes its successor's claim)
// and the client is answered 500 if the handler failed, else 503 with
// Retry-After. A retry with the same key executes again. A release that
// matches nothing means another attempt owns the key now: the client hears
// the key's current state.
func (a *attempt) releaseAndAnswer(ctx context.Context, cause error) {
	err := a.m.store.Release(ctx, a.lease)
	switch {
	case errors.Is(err, ErrLeaseLost) && !errors.Is(cause, ErrHandlerFailed):
		a.answerCurrentOwner(ctx, fmt.Errorf("%w; then: %w", cause, err))
		return
	case err != nil && !errors.Is(err, ErrLeaseLost):
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		cause = fmt.Errorf("%w; release: %v", cause, err)
	}
	a.answerReleased(cause)
}

// answerReleased answers an attempt that was rolled back and released.
func (a *attempt) answerReleased(cause error) {
	a.m.log(slog.LevelWarn, "attempt failed; key released", a.keyHash, "err", cause)
	p := a.problem(cause)
	a.answerProblem(p)
	a.done(Event{Outcome: OutcomeReleased, Status: p.Status, Err: cause})
}

// abort ends an attempt whose run asked that nothing be answered
// (Result.Abort), its transaction rolled back (and its key released).
func (a *attempt) abort(v any) {
	err, ok := v.(error)
	if !ok {
		err = fmt.Errorf("idempotency: run aborted: %v", v)
	}
	a.answer = Answer{Abort: v}
	a.done(Event{Outcome: OutcomeReleased, Err: err})
}

// answerCurrentOwner answers an attempt that lost its lease: it rolled back,
// and the client hears whatever the key's current state says. A record
// finished under this attempt's own lease is the exception: its finish
// landed and only the reply was lost (an earlier re-read that would have
// said so failed too), so the record is this attempt's answer, not a
// replay of another's.
func (a *attempt) answerCurrentOwner(ctx context.Context, cause error) {
	a.note(Event{Outcome: OutcomeLeaseLost, Err: cause})
	a.m.log(slog.LevelWarn, "lease lost; rolled back", a.keyHash, "err", cause)
	rec, err := a.lookup(ctx)
	if err != nil {
		// Released, or unreadable: nothing of ours committed; a retry decides.
		a.fail(OutcomeStoreError, fmt.Errorf("idempotency: lease lost, then: %w", err))
		return
	}
	if rec.Status.Final() && rec.Owner == a.lease.Owner && rec.Snapshot != nil && rec.Fingerprint == a.fingerprint {
		outcome := OutcomeCommitted
		if rec.Status == StatusFailed {
			outcome = OutcomeRejected
		}
		a.answerWith(rec.Snapshot.StatusCode, rec.Snapshot.Header, rec.Snapshot.Body)
		a.done(Event{Outcome: outcome, Status: rec.Snapshot.StatusCode})
		return
	}
	a.respondToDuplicate(rec)
}
