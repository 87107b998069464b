package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// execute is step 5: run the action inside a transaction, then step 6:
// finalize by what it answered (finalize.go).
func (a *attempt) execute() {
	wake := a.m.inflight.begin(a.scope, a.key)
	defer wake()

	res, err := a.runHandler()
	if err != nil {
		a.releaseAndAnswer(a.ctx, err)
		return
	}
	if a.renewing && res.verdict(a.m.cfg.IsFinalFunc) == verdictRetry {
		if res = a.runAgain(res); res == nil {
			return
		}
	}
	defer res.stop()
	a.finalize(res)
}

// runAgain serves a single-phase route renewing a key (see answerWinner)
// whose handler failed: the requests that met the old record beside this one
// rolled back their executions, and this one may have been the victim of
// their lock waits. Its handler only touches the database, so running it
// once more under the claim is as safe as single-phase's own re-executions.
// The lease is extended first (heartbeats may have moved it), so the second
// run cannot outlive it. It returns nil when the attempt was answered
// instead.
func (a *attempt) runAgain(res *handlerResult) *handlerResult {
	_ = res.tx.Rollback()
	res.stop()
	lease, err := a.m.store.Extend(a.ctx, res.exec.currentLease(), a.m.cfg.Lease)
	if err != nil {
		ctx, cancel := a.finalizeContext()
		defer cancel()
		if errors.Is(err, ErrLeaseLost) {
			a.answerCurrentOwner(ctx, err)
			return nil
		}
		a.lease = res.exec.currentLease()
		a.releaseAndAnswer(ctx, err)
		return nil
	}
	a.lease = lease
	again, err := a.runHandler()
	if err != nil {
		a.releaseAndAnswer(a.ctx, err)
		return nil
	}
	return again
}

// handlerResult is what one run of the action did inside its transaction.
type handlerResult struct {
	tx         *sql.Tx
	exec       *execution
	stop       func() // ends the handler's context and the transaction's
	status     int
	header     map[string][]string
	body       []byte
	panicked   any  // the value the run panicked with, or its Result.Abort
	aborted    bool // panicked is Result.Abort: answer nothing
	overflowed bool
}

type verdict int

const (
	verdictCommit verdict = iota // 2xx or 3xx: commit with the snapshot
	verdictReject                // final non-2xx: roll back, store the answer
	verdictRetry                 // non-final: roll back, let a retry execute
	verdictBroken                // panic or unstorable answer: roll back, 500 (503 for ErrRerunRefused)
)

func (h *handlerResult) verdict(isFinal func(int) bool) verdict {
	switch {
	case h.panicked != nil || h.overflowed:
		return verdictBroken
	case h.status >= 200 && h.status < 400:
		// A 3xx (303 See Other to the new order) points at what the
		// handler wrote: rolling it back would send the client to
		// nothing. Config.validate ensures IsFinalFunc agrees.
		return verdictCommit
	case !isFinal(h.status):
		return verdictRetry
	default:
		return verdictReject
	}
}

func (h *handlerResult) err(limit int) error {
	if refused, ok := h.panicked.(error); ok && errors.Is(refused, ErrRerunRefused) {
		return refused // not the handler's failure: answered 503 (see ErrRerunRefused)
	}
	if h.panicked != nil {
		return fmt.Errorf("%w: panicked: %v", ErrHandlerFailed, h.panicked)
	}
	return fmt.Errorf("%w: response body over MaxSnapshotBytes (%d)", ErrHandlerFailed, limit)
}

// runHandler begins the transaction and runs the action with it in its
// context. Both are detached from the client's context: an agent whose
// gateway timed out has usually gone away, and the order it asked for should
// still commit so that its retry replays it. The handler's context ends a
// tenth before the lease does (ExtendLease moves that); the transaction's
// lives until finalize has committed or rolled it back.
func (a *attempt) runHandler() (*handlerResult, error) {
	txCtx, stopTx := context.WithCancel(context.WithoutCancel(a.ctx))
	return a.runIn(func() (*sql.Tx, error) { return a.m.beginTx(txCtx) }, stopTx, handlerBudget(a.m.cfg.Lease))
}

// beginTx starts the handler's transaction, with Config.TxOptions when set
// (New checked that the store takes them).
func (m *Middleware) beginTx(ctx context.Context) (*sql.Tx, error) {
	if m.cfg.TxOptions != nil {
		return m.store.(TxOptionsBeginner).BeginTxOptions(ctx, m.cfg.TxOptions)
	}
	return m.store.BeginTx(ctx)
}

// runIn runs the action once in the transaction begin returns: its own,
// or a batch's (batch.go). The handler's context ends after budget;
// stopTx ends the transaction's context, with the result's stop. A panic
// becomes a value, so that the transaction is rolled back.
func (a *attempt) runIn(begin func() (*sql.Tx, error), stopTx func(), budget time.Duration) (*handlerResult, error) {
	handlerCtx, stopHandler := context.WithCancel(context.WithoutCancel(a.ctx))
	exec := &execution{
		store: a.m.store, lease: a.lease, key: a.key, scope: a.scope, leaseD: a.m.cfg.Lease,
		singlePhase: a.mode == ModeSinglePhase,
		deadline:    time.AfterFunc(budget, stopHandler),
	}
	res := &handlerResult{exec: exec, stop: func() { exec.deadline.Stop(); stopHandler(); stopTx() }}

	handlerCtx, endStage := a.m.startStage(handlerCtx, StageExecute)
	end := func(e StageEnd) { e.KeyHash = a.keyHash; endStage(e) }
	tx, err := begin()
	if err != nil {
		res.stop()
		end(StageEnd{Outcome: OutcomeStoreError, Err: err})
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		return nil, err
	}
	exec.tx, res.tx = tx, tx
	func() {
		defer func() {
			if v := recover(); v != nil {
				res.panicked = v
			}
		}()
		r := a.run(context.WithValue(handlerCtx, contextKey{}, exec))
		res.status, res.header, res.body = r.Status, withoutNUL(r.Header), r.Body
		res.overflowed = r.TooLarge || len(r.Body) > a.m.cfg.MaxSnapshotBytes
		res.panicked, res.aborted = r.Abort, r.Abort != nil
	}()
	if res.panicked != nil {
		end(StageEnd{Err: res.err(0)})
	} else {
		end(StageEnd{})
	}
	return res, nil
}

// withoutNUL replaces each NUL in h's values with a space, in place. RFC
// 9110 §5.5 calls a field value holding NUL invalid and dangerous and has a
// recipient reject it or replace each NUL with a space (net/http does so
// with CR and LF when it writes a header); PostgreSQL's jsonb cannot store
// one (22P05). Replacing it in the run's answer, before it is sent and
// recorded, keeps the first answer and every replay equal on every dialect,
// whatever the front-end.
func withoutNUL(h map[string][]string) map[string][]string {
	for _, values := range h {
		for i, v := range values {
			if strings.IndexByte(v, 0) >= 0 {
				values[i] = strings.ReplaceAll(v, "\x00", " ")
			}
		}
	}
	return h
}
