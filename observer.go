package idempotency

import (
	"context"
	"time"
)

// Outcome names one decision of the protocol. Outcomes are a small fixed
// set, safe to use as a metrics label.
type Outcome string

// Outcomes reported to an Observer. A request reports zero or more step
// outcomes and exactly one final outcome, whose Event has Final set and
// carries the request's duration. Claimed, TakenOver, LeaseLost and Collided
// are always steps; StoreError is a step when the request still got another
// answer (e.g. a failed release) and final when it decided the answer.
const (
	// Steps.
	OutcomeClaimed   Outcome = "claimed"    // this request claimed a new key
	OutcomeTakenOver Outcome = "taken_over" // it took over an expired lease or record
	OutcomeLeaseLost Outcome = "lease_lost" // it lost its lease and rolled back
	OutcomeCollided  Outcome = "collided"   // single-phase: it executed, met a concurrent winner and rolled back

	// Final outcomes.
	OutcomeCommitted   Outcome = "committed"      // handler answered 2xx; order and snapshot committed
	OutcomeRejected    Outcome = "rejected"       // handler answered a final non-2xx; stored as FAILED
	OutcomeReleased    Outcome = "released"       // 5xx, panic or error: rolled back, key released
	OutcomeReplayed    Outcome = "replayed"       // a stored snapshot was replayed
	OutcomeConflict    Outcome = "conflict"       // same key, different fingerprint
	OutcomeInProgress  Outcome = "in_progress"    // another attempt holds the key
	OutcomeInvalid     Outcome = "invalid"        // bad input rejected before the claim
	OutcomeUnprotected Outcome = "unprotected"    // no key, and keys are optional
	OutcomeStoreError  Outcome = "store_error"    // the store failed; nothing was executed or it was rolled back
	OutcomeUnknown     Outcome = "commit_unknown" // COMMIT's outcome could not be learned; the key stays claimed

	// Background work (Reconciler and Purge); Count says how many records.
	OutcomeRecovered Outcome = "recovered" // reconciler found the effect and backfilled the snapshot
	OutcomeReclaimed Outcome = "reclaimed" // reconciler found no effect and released the key
	OutcomePurged    Outcome = "purged"    // expired final records deleted
)

// Event is one observation.
type Event struct {
	Route    string // Config.Route
	Outcome  Outcome
	Status   int           // HTTP status answered (final outcomes)
	Replayed Status        // for OutcomeReplayed: the record's final status
	From     ReplaySource  // for OutcomeReplayed: where the snapshot came from
	Duration time.Duration // for final outcomes: time since the request arrived
	Err      error         // for OutcomeStoreError, OutcomeReleased, OutcomeUnknown
	KeyHash  string        // KeyHash of the scope and key; never the raw key
	Count    int64         // for background outcomes
	Final    bool          // the request's one final outcome
}

// ReplaySource says where a replayed snapshot came from. A replay from the
// store that followed an execution (a single-phase duplicate that collided
// and rolled back) has also reported OutcomeCollided as a step.
type ReplaySource string

// Replay sources.
const (
	ReplayFromCache  ReplaySource = "cache"  // this process's replay cache: the store was not asked
	ReplayFromShared ReplaySource = "shared" // Config.SharedCache (Redis): the store was not asked
	ReplayFromStore  ReplaySource = "store"  // the record, read from the store
)

// Stage is a timed part of the protocol.
type Stage string

// Stages reported to a StageObserver. StageRequest encloses the others.
const (
	StageRequest  Stage = "request"
	StageClaim    Stage = "claim"
	StageExecute  Stage = "execute"
	StageFinalize Stage = "finalize"
	StageReplay   Stage = "replay"
)

// StageEnd describes how a stage ended.
type StageEnd struct {
	Outcome Outcome // for StageRequest: the final outcome
	Record  Status  // the record's status as this stage left or found it, if known
	KeyHash string  // KeyHash of the scope and key, once known; never the raw key
	Err     error
}

// StageObserver is an optional extension of Observer for tracing and
// latency histograms: the middleware calls StartStage when a stage begins and
// the returned function when it ends. The returned context is passed to the
// stage's work (so a tracer can parent the store's spans).
type StageObserver interface {
	StartStage(ctx context.Context, s Stage, route string) (context.Context, func(StageEnd))
}

// Observer receives every outcome of the protocol. It must be safe for
// concurrent use and fast: it runs on the request path.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe implements Observer.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

type nopObserver struct{}

func (nopObserver) Observe(context.Context, Event) {}

// Observers combines several observers into one, for instance metrics and
// tracing. Observe calls each in turn; StartStage chains the context through
// every StageObserver among them and ends their stages in reverse order.
func Observers(obs ...Observer) Observer { return multiObserver(obs) }

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}

func (m multiObserver) StartStage(ctx context.Context, s Stage, route string) (context.Context, func(StageEnd)) {
	var ends []func(StageEnd)
	for _, o := range m {
		if so, ok := o.(StageObserver); ok {
			var end func(StageEnd)
			ctx, end = so.StartStage(ctx, s, route)
			ends = append(ends, end)
		}
	}
	return ctx, func(e StageEnd) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](e)
		}
	}
}
