package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"
)

// BatchAction is one action of a batch (DoBatch) and its run.
type BatchAction struct {
	Action
	Run RunFunc
}

// DoBatch runs a batch of actions under the protocol and commits every run
// it executes, with its record, in one transaction: one COMMIT for many
// actions, which is what a queue consumer taking messages in batches saves.
// It returns one answer per action, in order, each one Do could have
// given.
//
// Each action is first answered as Do answers it without running it when
// it can be: bad input is refused, a finished key replayed (or refused as
// reused with another fingerprint), and, claim-first, a key that another
// attempt holds is answered in progress once the batch has ended. An action
// whose scope and key an earlier action of the batch carries is done by Do
// after the batch: it replays that action's answer, or conflicts with it.
// The other actions run one after another in the batch's transaction
// (TxFromContext gives each run that one transaction, KeyFromContext its
// own key). When every run answers a 2xx or 3xx and every record is
// written, the transaction commits once, with every record; a COMMIT whose
// outcome is unknown is resolved for each action as Do resolves its own.
// Otherwise, a run that answered anything else, panicked, or a record the
// database refused, the transaction is rolled back and each of these
// actions is done alone, as Do does it, under the claim it holds:
// an action's failure costs the others their shared transaction, never
// their answer.
//
// So a run may run twice: in the batch, rolled back, then alone. Batch only
// actions whose every effect is in the transaction, as ModeSinglePhase
// requires of every action.
func (m *Middleware) DoBatch(ctx context.Context, batch []BatchAction) []Answer {
	answers := make([]Answer, len(batch))
	b := &batchRun{m: m, start: time.Now()}
	var later []int // a key an earlier action of the batch carries
	seen := make(map[string]bool, len(batch))
	for i, act := range batch {
		id := inflightKey(act.Scope, act.Key)
		if seen[id] {
			later = append(later, i)
			continue
		}
		seen[id] = true
		a := m.newAttempt(ctx)
		a.scope, a.key, a.fingerprint, a.run = act.Scope, act.Key, act.Fingerprint, act.Run
		b.all = append(b.all, batchMember{i: i, a: a})
		if err := m.check(act.Action); err != nil {
			a.reject(err)
			continue
		}
		a.keyHash = KeyHash(a.scope, a.key)
	}
	b.admitAll()
	b.execute()
	for _, mb := range b.all {
		answers[mb.i] = mb.a.answer
	}
	for _, i := range later {
		answers[i] = m.Do(ctx, batch[i].Action, batch[i].Run)
	}
	return answers
}

// batchRun is one DoBatch: its actions' attempts and the shared
// transaction's work.
type batchRun struct {
	m     *Middleware
	start time.Time
	all   []batchMember
	runs  []*batchMember // the actions that run in the batch's transaction
}

// batchMember is one action of a batch.
type batchMember struct {
	i      int // its index in the batch
	a      *attempt
	unmark func()         // Config.SharedCache's in-flight marker, if set
	dup    *Record        // claim-first: the record holding the key, answered after the batch
	res    *handlerResult // its run in the batch's transaction
	snap   *Snapshot
	done   Lease // claim-first: its record as FinishTx left it
}

// admitParallel bounds how many actions of a batch are admitted at once:
// claim-first claims each key in a statement of its own, and claims sent
// together share the database's log flushes (group commit) instead of
// each waiting for its own.
const admitParallel = 8

// admitAll admits every action not yet answered, admitParallel at a time,
// and lines up the runs in the batch's order.
func (b *batchRun) admitAll() {
	joins := make([]bool, len(b.all))
	sem := make(chan struct{}, admitParallel)
	var wg sync.WaitGroup
	for i := range b.all {
		if b.all[i].a.keyHash == "" {
			continue // refused already
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			joins[i] = b.admit(&b.all[i])
		})
	}
	wg.Wait()
	for i := range b.all {
		if joins[i] {
			b.runs = append(b.runs, &b.all[i])
		}
	}
}

// admit answers an action as Do would before running it, when it can be,
// and otherwise reports that it joins the runs (claim-first: having
// claimed its key).
func (b *batchRun) admit(mb *batchMember) bool {
	att := mb.a
	if rec := b.m.cache.get(att.scope, att.key); rec != nil {
		att.from = ReplayFromCache
		att.respondToDuplicate(rec)
		return false
	}
	unmark, answered := att.preFilter()
	if answered {
		return false
	}
	mb.unmark = unmark
	if att.mode == ModeSinglePhase {
		if b.m.replayHint.request() && att.answerFromRecord() {
			return false
		}
		att.lease = Lease{Scope: att.scope, Key: att.key, Owner: b.m.newOwner()}
		return true
	}
	claimed, rec, err := att.claim()
	switch {
	case err != nil:
		att.fail(OutcomeStoreError, err)
	case !claimed:
		// Answered after the batch: waiting for the key here (InFlightWait)
		// would hold every claim of the batch meanwhile.
		mb.dup = rec
	default:
		return true
	}
	return false
}

// execute runs the batch's actions in one transaction, or one by one when
// the transaction cannot commit them all, then answers the claim-first
// duplicates and ends the in-flight markers.
func (b *batchRun) execute() {
	if len(b.runs) > 0 && !b.runTogether() {
		for _, mb := range b.runs {
			b.runAlone(mb)
		}
	}
	for i := range b.all {
		mb := &b.all[i]
		if mb.dup != nil {
			mb.a.respondToDuplicate(mb.dup)
		}
		if mb.unmark != nil {
			mb.unmark()
		}
	}
}

// runAlone does one action of a batch that could not commit as Do does it,
// under the claim it holds (claim-first) or as a new single-phase run.
func (b *batchRun) runAlone(mb *batchMember) {
	if mb.res != nil {
		mb.a.lease = mb.res.exec.currentLease() // as its heartbeats left it
	}
	if mb.a.mode == ModeSinglePhase {
		mb.a.runSinglePhase()
		return
	}
	mb.a.execute()
}

// runTogether runs every action of b.runs in one transaction, writes each
// record in it and commits. It reports false, having rolled back and
// answered nothing, when the actions must be done one by one: a run that
// did not answer a 2xx or 3xx, a record or a COMMIT the database refused.
func (b *batchRun) runTogether() bool {
	m := b.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.runs[0].a.ctx), finalizeTimeout)
	defer cancel()
	txCtx, stopTx := context.WithCancel(context.WithoutCancel(b.runs[0].a.ctx))
	defer stopTx()
	tx, err := m.beginTx(txCtx)
	if err != nil {
		return false // each alone meets the database as it is
	}
	defer func() {
		for _, mb := range b.runs {
			if mb.res != nil {
				mb.res.stop()
			}
		}
	}()
	if m.cfg.Mode == ModeClaimFirst {
		for _, mb := range b.runs {
			wake := m.inflight.begin(mb.a.scope, mb.a.key)
			defer wake()
		}
	}
	// The claims were taken from b.start on: no run may outlive its lease.
	budget := handlerBudget(m.cfg.Lease) - time.Since(b.start)
	for _, mb := range b.runs {
		res, _ := mb.a.runIn(func() (*sql.Tx, error) { return tx, nil }, func() {}, max(budget, 0))
		mb.res = res
		if res.verdict(m.cfg.IsFinalFunc) != verdictCommit {
			_ = tx.Rollback()
			return false
		}
		mb.snap = m.snapshot(res.status, res.header, res.body)
		if mb.a.mode == ModeSinglePhase {
			err = m.store.InsertFinal(ctx, tx, mb.a.claimFor(), StatusDone, mb.snap)
		} else {
			mb.done, err = m.store.FinishTx(ctx, tx, res.exec.currentLease(), StatusDone, mb.snap, m.cfg.Retention)
		}
		if err != nil {
			_ = tx.Rollback()
			return false
		}
	}
	started := time.Now()
	err = tx.Commit()
	if err != nil && m.cfg.Mode == ModeSinglePhase && (errors.Is(err, ErrKeyClaimed) || answered(err)) {
		return false // the server refused the COMMIT: nothing committed
	}
	for _, mb := range b.runs {
		a := mb.a
		fctx, end := m.startStage(ctx, StageFinalize)
		switch {
		case err == nil:
			a.cacheOwn(StatusDone, mb.snap, started)
			a.answerWith(mb.snap.StatusCode, mb.res.header, mb.snap.Body)
			a.done(Event{Outcome: OutcomeCommitted, Status: mb.snap.StatusCode})
		case a.mode == ModeSinglePhase:
			a.resolveSinglePhaseCommit(fctx, mb.res, mb.snap, err)
		default:
			a.lease = mb.res.exec.currentLease()
			a.resolveCommit(fctx, mb.done, mb.res.header, mb.snap, err)
		}
		end(StageEnd{Outcome: a.outcome, KeyHash: a.keyHash})
	}
	return true
}
