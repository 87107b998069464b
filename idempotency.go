package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Middleware makes a handler idempotent. Create it with New; one Middleware
// per protected route, all sharing one Store.
//
// The protocol itself knows no transport: Do runs it for an action that a
// front-end has read from its own request. Handler is the net/http
// front-end; gRPC and queue consumers are front-ends in modules of their
// own.
type Middleware struct {
	store         Store
	cfg           Config
	fingerprint   FingerprintFunc
	op            *operation // Config.Operation made ready
	replayHeaders []string
	inflight      inflight
	cache         *replayCache
	replayHint    replayHint // single-phase: read the record before executing?
}

// New returns a Middleware over store. A nil cfg means the defaults.
func New(store Store, cfg *Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: New needs a Store")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := ownerFits(store, c.InstanceID); err != nil {
		return nil, err
	}
	if _, ok := store.(TxOptionsBeginner); c.TxOptions != nil && !ok {
		return nil, fmt.Errorf("idempotency: Config.TxOptions needs a store that starts transactions with options (TxOptionsBeginner); %T is not one", store)
	}
	m := &Middleware{store: store, cfg: c, fingerprint: c.FingerprintFunc}
	if c.Operation != nil {
		op, err := newOperation(*c.Operation)
		if err != nil {
			return nil, err
		}
		m.op, m.fingerprint = op, op.fingerprintRequest
	}
	if m.fingerprint == nil {
		m.fingerprint = NewFingerprint(c.Fingerprint)
	}
	for _, h := range append([]string{"Content-Type", "Location", "ETag"}, c.ReplayHeaders...) {
		m.replayHeaders = append(m.replayHeaders, http.CanonicalHeaderKey(h))
	}
	m.inflight.waiters = map[string]chan struct{}{}
	m.cache = newReplayCache(c.ReplayCacheBytes, time.Now)
	return m, nil
}

// Mode reports the route's recording mode. Front-ends use it: in
// ModeSinglePhase the handler may run more than once in one request (after
// the database rolled a run back, or to renew a key past its retention), so
// a front-end must be able to run it again.
func (m *Middleware) Mode() Mode { return m.cfg.Mode }

// Config returns the route's configuration with its defaults applied, for
// front-ends that read an action themselves (the key's syntax and length,
// the body limit, whether a key is optional).
func (m *Middleware) Config() Config { return m.cfg }

// Handler wraps next, the create-order (or any non-idempotent) handler. next
// runs at most once per (scope, key) and fingerprint; it finds its
// transaction with TxFromContext.
//
// A request's way: 1. the key from the header, 2. the scope from
// Config.ScopeFunc, 3. the fingerprint over the request (http.go), then the
// protocol's steps 4 to 7 (protect), then the answer, written once.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := &exchange{a: m.newAttempt(r.Context()), w: w, r: r, next: next}
		x.serve()
	})
}

// Do runs action under the protocol and returns its answer for the caller's
// transport to send: the transport-free core that Handler, the gRPC
// interceptor and the queue consumers share. run executes the action inside
// the record's transaction (see RunFunc); it runs at most once per scope,
// key and fingerprint, as Handler's handler does. An action whose key, scope
// or fingerprint a record cannot hold is refused (Answer.Problem) before
// anything runs or is written.
func (m *Middleware) Do(ctx context.Context, action Action, run RunFunc) Answer {
	a := m.newAttempt(ctx)
	a.scope, a.key, a.fingerprint = action.Scope, action.Key, action.Fingerprint
	if err := m.check(action); err != nil {
		a.reject(err)
		return a.answer
	}
	a.keyHash = KeyHash(a.scope, a.key)
	return a.protect(run)
}

// Reject answers an action that its front-end refused before the protocol
// could run it: a key of the wrong syntax, no principal, a message that
// does not parse or is too large. The answer is err's problem (a *Problem,
// or one of ErrMissingKey, ErrInvalidKey, ErrInvalidBody, ErrBodyTooLarge
// and ErrUnsupportedMediaType), reported to the Observer as OutcomeInvalid
// as Handler reports its own refusals. Nothing is written.
func (m *Middleware) Reject(ctx context.Context, err error) Answer {
	a := m.newAttempt(ctx)
	a.reject(err)
	return a.answer
}

// attempt is one request's way through the protocol, whatever its
// transport.
type attempt struct {
	m    *Middleware
	ctx  context.Context
	run  RunFunc
	mode Mode // the route's, unless a single-phase request renews an expired key
	// renewing: a single-phase request serving an expired key claim-first.
	renewing bool

	start       time.Time
	endRequest  func(StageEnd)
	scope       string
	key         string
	keyHash     string
	fingerprint string
	lease       Lease        // held while executing
	outcome     Outcome      // the final outcome, once done
	answer      Answer       // the answer, once done
	from        ReplaySource // where a replay comes from, if not the store
	// waitUntil ends every wait for another attempt's outcome (in the
	// shared cache, then in the Store): one InFlightWait from the first.
	waitUntil time.Time
	// sharedBlind: a call to Config.SharedCache failed or was skipped for
	// this request, so its miss says nothing about the key (shared.go).
	sharedBlind bool
	// sharedMarked: this attempt's in-flight marker is set in
	// Config.SharedCache; the replay it leaves (sharedPut, for
	// sharedPutTTL) goes there with the marker's removal.
	sharedMarked bool
	sharedPut    *Record
	sharedPutTTL time.Duration
}

// newAttempt starts a request's attempt and its StageRequest.
func (m *Middleware) newAttempt(ctx context.Context) *attempt {
	a := &attempt{m: m, mode: m.cfg.Mode, start: time.Now()}
	a.ctx, a.endRequest = m.startStage(ctx, StageRequest)
	return a
}

// protect is the protocol for an action whose key, scope and fingerprint
// (steps 1 to 3) its front-end has read, one step per stage:
// claim → execute → finalize, answering duplicates from the caches or the
// record along the way. It returns the answer.
func (a *attempt) protect(run RunFunc) Answer {
	a.run = run
	// A finished key this process has seen is answered without the store.
	if rec := a.m.cache.get(a.scope, a.key); rec != nil {
		a.from = ReplayFromCache
		a.respondToDuplicate(rec)
		return a.answer
	}
	// Config.SharedCache, if any: a pre-filter, never the source of truth (shared.go).
	unmark, answered := a.preFilter()
	if answered {
		return a.answer
	}
	defer unmark()
	if a.mode == ModeSinglePhase {
		a.serveSinglePhase() // steps 5 and 6 with the record written last (singlephase.go)
		return a.answer
	}
	a.serveClaimFirst()
	return a.answer
}

// serveClaimFirst is steps 4 to 7 in ModeClaimFirst.
func (a *attempt) serveClaimFirst() {
	// 4. Claim (claim.go).
	claimed, rec, err := a.claim()
	switch {
	case err != nil:
		a.fail(OutcomeStoreError, err)
	case !claimed:
		// 7. A duplicate: replay, conflict or in progress (replay.go).
		a.respondToDuplicate(rec)
	default:
		// 5. Execute (execute.go), then 6. finalize (finalize.go).
		a.execute()
	}
}
