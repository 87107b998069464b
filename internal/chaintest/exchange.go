package chaintest

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/orderguard/idempotency"
)

// Exchange is one request of a chain as its steps see it: which run of the
// chain this is, what the steps did, and the orders they wrote. A step
// finds it with From(request.Context()).
type Exchange struct {
	chain *Chain
	tag   string  // prefixes the request's order numbers
	db    *sql.DB // for the plain chain's transaction

	mu      sync.Mutex
	run     int
	outer   []string     // the front's events
	inner   []string     // this run's events behind the middleware
	aborted map[int]bool // runs the front-end reported aborted (gin)
	plainTx *sql.Tx      // the plain chain's transaction, begun by the first order
	created bool         // a step of some run wrote an order

	// RerunRollback: blocker holds the key's record row until run 2;
	// blocked reports the end of its wait for the first run's row.
	blocker  *sql.Tx
	blocked  chan error
	forceErr error // the first run's row could not be written

	// RerunRenewalAtInsert: stores the record past its retention when the
	// first run is finalized.
	expireAtFinalize func(context.Context) error
}

type exchangeKey struct{}

func withExchange(ctx context.Context, e *Exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, e)
}

// From returns the Exchange of the request whose context is ctx. It panics
// if there is none: every request Run sends carries one.
//
// In the first run of a request that the test makes the database roll back
// (RerunRollback), the first call with the run's context also writes the
// run's row of the deadlock that does it (see suite.holdRecord): every
// chain has a step behind the middleware, and its first step always runs.
func From(ctx context.Context) *Exchange {
	e, ok := ctx.Value(exchangeKey{}).(*Exchange)
	if !ok {
		panic("chaintest: the request's context carries no Exchange")
	}
	e.forceDeadlock(ctx)
	return e
}

// forceDeadlock writes, in the first run's transaction, a row the
// transaction holding the key's record then waits for. The run's record
// INSERT closes the cycle and the database rolls the run back.
func (e *Exchange) forceDeadlock(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.blocker == nil || e.blocked != nil || e.run != 1 {
		return
	}
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return // a step in front of the middleware
	}
	e.blocked = make(chan error, 1)
	if _, err := tx.ExecContext(ctx, "INSERT INTO chaintest_lock (tag) VALUES (?)", e.tag); err != nil {
		e.forceErr = err
		e.blocked <- nil
		return
	}
	go func(blocker *sql.Tx, blocked chan<- error) {
		_, err := blocker.Exec("SELECT tag FROM chaintest_lock WHERE tag = ? FOR UPDATE", e.tag)
		blocked <- err
	}(e.blocker, e.blocked)
}

// Run is the number of the chain's current run: 1 for the first (and for a
// plain chain, the run it stands for).
func (e *Exchange) Run() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.run
}

// Refuses reports whether guard s refuses in this run. A step in front of
// the middleware runs before the first run, as in run 1.
func (e *Exchange) Refuses(s Step) bool { return s.Refuses(max(e.Run(), 1)) }

// Note records that step s did what: the trace that must be the same behind
// the middleware as in front of the framework alone.
func (e *Exchange) Note(s Step, what string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	event := s.Label + ":" + what
	if s.Outer() {
		e.outer = append(e.outer, event)
	} else {
		e.inner = append(e.inner, event)
	}
}

// Aborted records that this run of the chain ended aborted (gin's
// c.IsAborted()): a run after it may be refused (ErrRerunRefused).
func (e *Exchange) Aborted() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.aborted[e.run] = true
}

// Header is the response header step s adds to: one for the front, one for
// the protected steps, since the middleware answers with the handler's
// headers in place of those of the same name set in front of it.
func (e *Exchange) Header(s Step) string {
	if s.Outer() {
		return "X-Chain-Outer"
	}
	return "X-Chain"
}

// Fragment is the body fragment step s writes where ("before", "after").
func (e *Exchange) Fragment(s Step, where string) string { return s.Label + "-" + where + ";" }

// Location is the Location of the order step s creates.
func (e *Exchange) Location(s Step) string { return fmt.Sprintf("/orders/%d-%s", e.chain.ID, s.Label) }

// Created is the JSON body of the order step s creates.
func (e *Exchange) Created(s Step) map[string]string {
	return map[string]string{"created": s.Label, "chain": fmt.Sprint(e.chain.ID)}
}

// Refusal is the JSON body guard s refuses with.
func (e *Exchange) Refusal(s Step) map[string]string { return map[string]string{"refused": s.Label} }

// RefusalError is the error a GuardError step refuses with; a front-end's
// error renderer answers it with Status.
type RefusalError struct {
	Status int
	Step   string
}

func (e *RefusalError) Error() string { return "refused by " + e.Step }

// Error is the error guard s refuses with.
func (e *Exchange) Error(s Step) *RefusalError { return &RefusalError{Status: s.Status, Step: s.Label} }

// CreateOrder writes step s's order in the request's transaction: the
// middleware's (idempotency.TxFromContext), or for the plain chain one the
// test commits when the chain answered 2xx or 3xx. Its order number names
// the request, the run and the step, so that an order left by a discarded
// run is seen.
func (e *Exchange) CreateOrder(ctx context.Context, s Step) error {
	e.mu.Lock()
	e.created = true
	e.mu.Unlock()
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		var err error
		if tx, err = e.plainTransaction(ctx); err != nil {
			return err
		}
	}
	return idempotency.CreateOrder(ctx, tx, &idempotency.Order{
		OrderNo: fmt.Sprintf("%s/%d/%s", e.tag, e.Run(), s.Label),
		UserID:  1, SKUID: 20001, Quantity: 1, UnitPriceCents: 100, TotalCents: 100,
	})
}

func (e *Exchange) plainTransaction(ctx context.Context) (*sql.Tx, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.plainTx == nil {
		tx, err := e.db.BeginTx(context.WithoutCancel(ctx), nil)
		if err != nil {
			return nil, err
		}
		e.plainTx = tx
	}
	return e.plainTx, nil
}

// beginRun starts a run of the protected chain (the middleware's execute
// stage): its events replace the discarded run's, and a record row held to
// roll the first run back is let go before the second.
func (e *Exchange) beginRun() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.run++
	e.inner = nil
	if e.run == 2 {
		e.releaseBlocker()
	}
}

// finalizeRun is called when the middleware starts to finalize a run.
func (e *Exchange) finalizeRun(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expireAtFinalize != nil && e.run == 1 {
		if err := e.expireAtFinalize(ctx); err != nil && e.forceErr == nil {
			e.forceErr = err
		}
		e.expireAtFinalize = nil
	}
}

// releaseBlocker rolls back the transaction holding the key's record, once
// its wait for the first run's row has ended (the run was rolled back).
func (e *Exchange) releaseBlocker() {
	if e.blocker == nil {
		return
	}
	if e.blocked != nil {
		<-e.blocked
	}
	_ = e.blocker.Rollback()
	e.blocker = nil
}

// trace returns the front's events and the last run's.
func (e *Exchange) trace() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append(append([]string(nil), e.outer...), e.inner...)
}

// abortedBefore reports whether a run before the last ended aborted.
func (e *Exchange) abortedBefore() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for run := 1; run < e.run; run++ {
		if e.aborted[run] {
			return true
		}
	}
	return false
}
