package idempotency

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

type contextKey struct{}

// execution is what the middleware hands a wrapped handler through its
// request context.
type execution struct {
	tx     *sql.Tx
	store  Store
	key    string
	scope  string
	leaseD time.Duration
	// deadline cancels the handler's context shortly before the lease ends;
	// ExtendLease resets it.
	deadline *time.Timer

	mu    sync.Mutex // a handler may heartbeat from its own goroutine
	lease Lease

	// singlePhase: no record exists while the handler runs, so there is no
	// lease to extend; only the deadline moves.
	singlePhase bool
}

func (e *execution) currentLease() Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// TxFromContext returns the transaction the middleware opened for this
// request. The handler does all its business writes in it and must neither
// commit nor roll it back: the middleware commits it together with the
// response snapshot, or rolls it back.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	e, ok := ctx.Value(contextKey{}).(*execution)
	if !ok || e.tx == nil {
		return nil, false
	}
	return e.tx, true
}

// KeyFromContext returns the scope and idempotency key of the request being
// executed, for handlers that store them with the business row (as
// purchase_order does, the last line of defence against duplicates).
func KeyFromContext(ctx context.Context) (scope, key string, ok bool) {
	e, ok := ctx.Value(contextKey{}).(*execution)
	if !ok {
		return "", "", false
	}
	return e.scope, e.key, true
}

// ExtendLease pushes the current request's lease to now+Config.Lease by the
// store's clock: the heartbeat for a handler that may run longer than one
// lease. On success the handler's context deadline moves with it. It returns
// ErrLeaseLost if another attempt took the key over, in which case the handler
// should stop: its transaction can no longer commit. On a single-writer
// store (SQLite) the open transaction already excludes every other attempt,
// so only the deadline moves.
func ExtendLease(ctx context.Context) error {
	e, ok := ctx.Value(contextKey{}).(*execution)
	if !ok {
		return ErrNoTransaction
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if sw, ok := e.store.(interface{ SingleWriter() bool }); e.singlePhase || (ok && sw.SingleWriter()) {
		e.deadline.Reset(handlerBudget(e.leaseD))
		return nil
	}
	extended, err := e.store.Extend(ctx, e.lease, e.leaseD)
	if err != nil {
		return err
	}
	e.lease = extended
	e.deadline.Reset(handlerBudget(e.leaseD))
	return nil
}

// handlerBudget is how long a handler may run under a fresh lease: a tenth
// less than the lease, so that its transaction ends before another attempt
// may take the key over.
func handlerBudget(lease time.Duration) time.Duration {
	return lease - lease/10
}
