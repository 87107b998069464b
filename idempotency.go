package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Middleware makes a handler idempotent. Create it with New; one Middleware
// per protected route, all sharing one Store.
type Middleware struct {
	store         Store
	cfg           Config
	fingerprint   FingerprintFunc
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
	m := &Middleware{store: store, cfg: c, fingerprint: c.FingerprintFunc}
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

// Mode reports the route's recording mode. Adapters use it: in
// ModeSinglePhase the handler may run more than once in one request (after
// the database rolled a run back, or to renew a key past its retention), so
// an adapter must be able to run it again.
func (m *Middleware) Mode() Mode { return m.cfg.Mode }

// Handler wraps next, the create-order (or any non-idempotent) handler. next
// runs at most once per (scope, key) and fingerprint; it finds its
// transaction with TxFromContext.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := &attempt{m: m, w: w, r: r, next: next, mode: m.cfg.Mode, start: time.Now()}
		a.ctx, a.endRequest = m.startStage(r.Context(), StageRequest)
		a.serve()
	})
}

// attempt is one request's way through the protocol.
type attempt struct {
	m    *Middleware
	w    http.ResponseWriter
	r    *http.Request
	next http.Handler
	ctx  context.Context
	mode Mode // the route's, unless a single-phase request renews an expired key
	// renewing: a single-phase request serving an expired key claim-first.
	renewing bool

	start       time.Time
	endRequest  func(StageEnd)
	scope       string
	key         string
	keyHash     string
	fingerprint string
	body        []byte
	bodyReader  bodyReader   // r.Body from step 3 on (rewindBody)
	lease       Lease        // held while executing
	outcome     Outcome      // the final outcome, once done
	from        ReplaySource // where a replay comes from, if not the store
	// waitUntil ends every wait for another attempt's outcome (in the
	// shared cache, then in the Store): one InFlightWait from the first.
	waitUntil time.Time
	// sharedBlind: a call to Config.SharedCache failed or was skipped for
	// this request, so its miss says nothing about the key (shared.go).
	sharedBlind bool
}

// serve is the protocol, one step per stage:
// key → scope → fingerprint → claim → execute → finalize, answering
// duplicates from the cache or the store along the way.
func (a *attempt) serve() {
	// 1. Key.
	if err := a.readKey(); err != nil {
		if errors.Is(err, ErrMissingKey) && a.m.cfg.KeyOptional {
			a.passThrough()
			return
		}
		a.reject(err)
		return
	}
	// 2. Scope.
	if err := a.readScope(); err != nil {
		a.reject(err)
		return
	}
	// 3. Fingerprint.
	if err := a.readFingerprint(); err != nil {
		a.reject(err)
		return
	}
	// A finished key this process has seen is answered without the store.
	if rec := a.m.cache.get(a.scope, a.key); rec != nil {
		a.from = ReplayFromCache
		a.respondToDuplicate(rec)
		return
	}
	// Config.SharedCache, if any: a pre-filter, never the source of truth (shared.go).
	unmark, answered := a.preFilter()
	if answered {
		return
	}
	defer unmark()
	if a.mode == ModeSinglePhase {
		a.serveSinglePhase() // steps 5 and 6 with the record written last
		return
	}
	a.serveClaimFirst()
}

// serveClaimFirst is steps 4 to 6 in ModeClaimFirst.
func (a *attempt) serveClaimFirst() {
	// 4. Claim.
	claimed, rec, err := a.claim()
	switch {
	case err != nil:
		a.fail(OutcomeStoreError, err)
	case !claimed:
		a.respondToDuplicate(rec)
	default:
		// 5. Execute, then 6. finalize.
		a.execute()
	}
}

// passThrough serves a keyless request unprotected (KeyOptional).
func (a *attempt) passThrough() {
	defer func() {
		if v := recover(); v != nil {
			a.done(Event{Outcome: OutcomeUnprotected, Err: fmt.Errorf("idempotency: handler panicked: %v", v)})
			panic(v)
		}
	}()
	a.next.ServeHTTP(a.w, a.r)
	a.done(Event{Outcome: OutcomeUnprotected})
}

// readKey is step 1: the key header, in plain or RFC 8941 sf-string form.
func (a *attempt) readKey() error {
	name := a.m.cfg.HeaderName
	values := a.r.Header.Values(name)
	switch {
	case len(values) == 0 || (len(values) == 1 && values[0] == ""):
		return ErrMissingKey
	case len(values) > 1:
		return fmt.Errorf("%w: send exactly one %s header", ErrInvalidKey, name)
	}
	key, err := ParseKey(values[0], a.m.cfg.MaxKeyLength)
	if err != nil {
		return err
	}
	a.key = key
	return nil
}

// readScope is step 2: the principal that owns the key.
func (a *attempt) readScope() error {
	scope, err := a.m.cfg.ScopeFunc(a.r)
	if err != nil {
		var p *Problem
		if errors.As(err, &p) {
			return p
		}
		return NewProblem(http.StatusUnauthorized, ProblemScopeRequired, "Unauthenticated", err.Error())
	}
	if len(scope) > maxScopeBytes {
		return NewProblem(http.StatusUnauthorized, ProblemScopeRequired, "Unauthenticated", fmt.Sprintf("scope longer than %d bytes", maxScopeBytes))
	}
	a.scope = scope
	a.keyHash = KeyHash(scope, a.key)
	return nil
}

// readFingerprint is step 3. The body is read through MaxBodyBytes, so an
// oversized body is refused without being held in memory, and r.Body is
// replaced with the bytes read so the handler sees the same body.
func (a *attempt) readFingerprint() error {
	limit := a.m.cfg.MaxBodyBytes
	if a.r.ContentLength > limit {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, a.r.ContentLength, limit)
	}
	if a.r.Body != nil && a.r.Body != http.NoBody {
		body, err := readBody(a.r.Body, a.r.ContentLength, limit)
		if err != nil {
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				return fmt.Errorf("%w: %v", ErrBodyTooLarge, err)
			}
			return fmt.Errorf("%w: %v", ErrInvalidBody, err)
		}
		if int64(len(body)) > limit {
			return fmt.Errorf("%w: limit %d bytes", ErrBodyTooLarge, limit)
		}
		a.body = body
	}
	a.rewindBody()
	a.r.ContentLength = int64(len(a.body))

	fp, err := a.m.fingerprint(a.r, a.body)
	if err != nil {
		return err
	}
	a.rewindBody() // a custom FingerprintFunc may have read it
	if len(fp) == 0 || len(fp) > maxFingerprintBytes {
		return fmt.Errorf("idempotency: fingerprint must be 1..%d bytes, got %d", maxFingerprintBytes, len(fp))
	}
	a.fingerprint = fp
	return nil
}

// readBody reads at most limit+1 bytes of body. A declared length sizes the
// buffer, so a body is read into one allocation of its own size.
func readBody(body io.Reader, declared, limit int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 && declared <= limit {
		size = declared + 1 // +1: room to see the end without growing
	}
	buf := make([]byte, 0, size)
	r := io.LimitedReader{R: body, N: limit + 1}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// rewindBody gives the request the body that was read, from its start, for
// the fingerprint and for each run of the handler.
func (a *attempt) rewindBody() {
	a.bodyReader.Reset(a.body)
	a.r.Body = &a.bodyReader
}

// bodyReader is the body the handler reads: the bytes read in step 3.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// maxClaimRounds bounds how often a request re-reads a key whose record
// vanishes (released or purged) or changes under it before it gives up.
const maxClaimRounds = 4

// errKeyChurn means the key's record kept changing under a claim.
var errKeyChurn = errors.New("idempotency: claim: the key's record kept changing; retry")

// claim is step 4: a plain INSERT in autocommit. On a duplicate key the
// existing record is read with a fresh statement (a transaction's snapshot
// could hide the winner) and either taken over, when its lease or retention
// has expired, or returned for respondToDuplicate.
func (a *attempt) claim() (claimed bool, rec *Record, err error) {
	ctx, endStage := a.m.startStage(a.ctx, StageClaim)
	end := func(e StageEnd) { e.KeyHash = a.keyHash; endStage(e) }
	c := Claim{
		Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint,
		Owner: a.m.newOwner(), Lease: a.m.cfg.Lease, Retention: a.m.cfg.Retention,
	}
	got := func(lease Lease) (bool, *Record, error) {
		a.lease = lease
		a.note(Event{Outcome: OutcomeClaimed})
		end(StageEnd{Outcome: OutcomeClaimed, Record: StatusProcessing})
		return true, nil, nil
	}
	for range maxClaimRounds {
		lease, claimErr := a.m.store.Claim(ctx, c)
		if claimErr == nil {
			return got(lease)
		}
		if !errors.Is(claimErr, ErrKeyClaimed) && !mayHaveLanded(claimErr) {
			end(StageEnd{Outcome: OutcomeStoreError, Err: claimErr})
			return false, nil, claimErr
		}
		// The key is taken, or the connection failed and our INSERT may
		// have landed before it did: the record says which.
		rec, err := a.lookup(ctx)
		switch {
		case errors.Is(err, ErrRecordNotFound):
			continue // released or purged since, or our INSERT never landed: claim again
		case err != nil && !errors.Is(claimErr, ErrKeyClaimed):
			err = claimErr
			fallthrough
		case err != nil:
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		case rec.Status == StatusProcessing && rec.Owner == c.Owner:
			// Our INSERT landed, maybe long before the error reached us:
			// renew the lease (fenced) so the handler's budget fits inside
			// it. Lost meanwhile (taken over): start again.
			lease, err := a.m.store.Extend(ctx, Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: rec.Version}, c.Lease)
			switch {
			case err == nil:
				return got(lease)
			case errors.Is(err, ErrLeaseLost):
				continue
			}
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		}
		if !a.mayTakeOver(rec) {
			end(StageEnd{Record: rec.Status})
			return false, rec, nil
		}
		lease, err = a.m.store.TakeOver(ctx, c, Lease{Owner: rec.Owner, Version: rec.Version})
		if err == nil {
			a.lease = lease
			a.note(Event{Outcome: OutcomeTakenOver})
			a.m.log(slog.LevelWarn, "took over an abandoned key", a.keyHash,
				"previous_owner", rec.Owner, "lease_version", lease.Version, "record_expired", rec.Expired)
			end(StageEnd{Outcome: OutcomeTakenOver, Record: StatusProcessing})
			return true, nil, nil
		}
		if !errors.Is(err, ErrLeaseLost) {
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		}
		// Another request took it over or removed it first: start again.
	}
	end(StageEnd{Outcome: OutcomeStoreError, Err: errKeyChurn})
	return false, nil, errKeyChurn
}

// mayTakeOver: a final record past its retention is a new key; a PROCESSING
// record whose lease expired on the same request means its attempt died, so
// this one may finish the work. (A PROCESSING record never expires by
// retention: only its lease decides.)
func (a *attempt) mayTakeOver(rec *Record) bool {
	return rec.Expired ||
		(rec.Status == StatusProcessing && rec.LeaseExpired && rec.Fingerprint == a.fingerprint)
}

// execute is step 5: run the handler inside a transaction with a recording
// writer, then step 6: finalize by what it answered.
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
	a.rewindBody()
	again, err := a.runHandler()
	if err != nil {
		a.releaseAndAnswer(a.ctx, err)
		return nil
	}
	return again
}

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
		if res.panicked == http.ErrAbortHandler {
			_ = a.m.store.Release(ctx, a.lease)
			a.done(Event{Outcome: OutcomeReleased, Err: http.ErrAbortHandler})
			panic(res.panicked) // net/http aborts the response, as the handler asked
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

// handlerResult is what the wrapped handler did inside its transaction.
type handlerResult struct {
	tx         *sql.Tx
	exec       *execution
	stop       func() // ends the handler's context and the transaction's
	status     int
	header     http.Header
	body       []byte
	panicked   any
	overflowed bool
}

type verdict int

const (
	verdictCommit verdict = iota // 2xx or 3xx: commit with the snapshot
	verdictReject                // final non-2xx: roll back, store the answer
	verdictRetry                 // non-final: roll back, let a retry execute
	verdictBroken                // panic or unstorable answer: roll back, 500
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
	if h.panicked != nil {
		return fmt.Errorf("%w: panicked: %v", ErrHandlerFailed, h.panicked)
	}
	return fmt.Errorf("%w: response body over MaxSnapshotBytes (%d)", ErrHandlerFailed, limit)
}

// runHandler begins the transaction and calls the handler with it in its
// context. Both are detached from the client's context: an agent whose
// gateway timed out has usually gone away, and the order it asked for should
// still commit so that its retry replays it. The handler's context ends a
// tenth before the lease does (ExtendLease moves that); the transaction's
// lives until finalize has committed or rolled it back. A panic becomes a
// value, so that the transaction is rolled back.
func (a *attempt) runHandler() (*handlerResult, error) {
	base := context.WithoutCancel(a.ctx)
	txCtx, stopTx := context.WithCancel(base)
	handlerCtx, stopHandler := context.WithCancel(base)
	exec := &execution{
		store: a.m.store, lease: a.lease, key: a.key, scope: a.scope, leaseD: a.m.cfg.Lease,
		singlePhase: a.mode == ModeSinglePhase,
		deadline:    time.AfterFunc(handlerBudget(a.m.cfg.Lease), stopHandler),
	}
	res := &handlerResult{exec: exec, stop: func() { exec.deadline.Stop(); stopHandler(); stopTx() }}

	handlerCtx, endStage := a.m.startStage(handlerCtx, StageExecute)
	end := func(e StageEnd) { e.KeyHash = a.keyHash; endStage(e) }
	tx, err := a.m.store.BeginTx(txCtx)
	if err != nil {
		res.stop()
		end(StageEnd{Outcome: OutcomeStoreError, Err: err})
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		return nil, err
	}
	exec.tx, res.tx = tx, tx
	rec := newRecorder(a.w, a.m.cfg.MaxSnapshotBytes)
	func() {
		defer func() { res.panicked = recover() }()
		a.next.ServeHTTP(rec, a.r.WithContext(context.WithValue(handlerCtx, contextKey{}, exec)))
	}()
	res.status, res.header = rec.result()
	res.body, res.overflowed = rec.body.Bytes(), rec.overflowed
	if res.panicked != nil {
		end(StageEnd{Err: res.err(0)})
	} else {
		end(StageEnd{})
	}
	return res, nil
}

// commit is step 6 for a 2xx: finish the record with the snapshot inside the
// business transaction, then commit. The order rows and the snapshot commit
// together or not at all; the client hears nothing before the commit.
func (a *attempt) commit(ctx context.Context, tx *sql.Tx, header http.Header, snap *Snapshot) {
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
	a.m.cacheOwn(a.scope, a.key, a.fingerprint, StatusDone, snap, started)
	writeResponse(a.w, snap.StatusCode, header, snap.Body)
	a.done(Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
}

// resolveCommit decides what a failed COMMIT did. A dropped connection
// leaves the outcome unknown (the server may even still be committing), so
// the record is read again on a fresh connection: finished by our lease means
// the order committed. Still held by our lease proves nothing yet, because
// the commit may become visible a moment later; only a fenced release that
// actually deletes the claim proves the order did not commit. Anything else
// means another attempt owns the key now.
func (a *attempt) resolveCommit(ctx context.Context, finished Lease, header http.Header, snap *Snapshot, commitErr error) {
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
			writeResponse(a.w, snap.StatusCode, header, snap.Body)
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
func (a *attempt) storeRejection(ctx context.Context, header http.Header, snap *Snapshot) {
	started := time.Now()
	_, err := a.m.store.Finish(ctx, a.lease, StatusFailed, snap, a.m.cfg.Retention)
	switch {
	case errors.Is(err, ErrLeaseLost):
		a.answerCurrentOwner(ctx, err)
		return
	case err != nil:
		// The rejection is the true answer and nothing was written, so the
		// client still gets it; the key is released so that a retry decides
		// again rather than waiting out the lease.
		_ = a.m.store.Release(ctx, a.lease)
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
		a.m.log(slog.LevelError, "could not store a rejection; key released", a.keyHash, "err", err)
	default:
		a.m.cacheOwn(a.scope, a.key, a.fingerprint, StatusFailed, snap, started)
	}
	writeResponse(a.w, snap.StatusCode, header, snap.Body)
	a.done(Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
}

// releaseAndPassThrough handles a non-final status (5xx by default): nothing
// is stored and the key is released, so a retry executes again. The client
// gets the handler's own answer.
func (a *attempt) releaseAndPassThrough(ctx context.Context, status int, header http.Header, body []byte) {
	err := a.m.store.Release(ctx, a.lease)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		a.note(Event{Outcome: OutcomeStoreError, Err: err})
	}
	a.m.log(slog.LevelWarn, "handler failed; key released", a.keyHash, "status", status, "release_err", err)
	writeResponse(a.w, status, header, body)
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
	WriteProblem(a.w, p)
	a.done(Event{Outcome: OutcomeReleased, Status: p.Status, Err: cause})
}

// problem is the answer to a failure after the request was accepted. Only
// the handler's own failure is a 500; any other failure came from the
// infrastructure or a lost race, nothing of it was recorded, and the client
// is told when to retry: 503 (or 409 in-progress) with Retry-After.
func (a *attempt) problem(err error) *Problem {
	p := problemFor(err, a.m.cfg.ConflictStatus)
	if p.Kind() == ProblemExecutionFailed && !errors.Is(err, ErrHandlerFailed) {
		p = storeUnavailable()
	}
	if p.Status == http.StatusServiceUnavailable || p.Kind() == ProblemInProgress {
		p.RetryAfter = max(1, int(math.Ceil(a.m.cfg.RetryAfter.Seconds())))
	}
	return p
}

// answerCurrentOwner answers an attempt that lost its lease: it rolled back,
// and the client hears whatever the key's current state says.
func (a *attempt) answerCurrentOwner(ctx context.Context, cause error) {
	a.note(Event{Outcome: OutcomeLeaseLost, Err: cause})
	a.m.log(slog.LevelWarn, "lease lost; rolled back", a.keyHash, "err", cause)
	rec, err := a.lookup(ctx)
	if err != nil {
		// Released, or unreadable: nothing of ours committed; a retry decides.
		a.fail(OutcomeStoreError, fmt.Errorf("idempotency: lease lost, then: %w", err))
		return
	}
	a.respondToDuplicate(rec)
}

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
		writeReplay(a.w, rec.Snapshot)
		end(StageEnd{Outcome: OutcomeReplayed, Record: rec.Status, KeyHash: a.keyHash})
		a.done(Event{Outcome: OutcomeReplayed, Status: rec.Snapshot.StatusCode, Replayed: rec.Status, From: cmp.Or(a.from, ReplayFromStore)})
	default:
		p := a.problem(ErrInProgress)
		WriteProblem(a.w, p)
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
	WriteProblem(a.w, p)
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
	WriteProblem(a.w, p)
	a.done(Event{Outcome: outcome, Status: p.Status, Err: err})
}

// lookup reads the key's record with a fresh statement and caches it if it
// is final, for as long as the store says it lives.
func (a *attempt) lookup(ctx context.Context) (*Record, error) {
	rec, err := a.m.store.Lookup(ctx, a.scope, a.key)
	if err == nil && rec.Status.Final() && !rec.Expired {
		ttl := rec.ExpiresAt.Sub(rec.ReadAt)
		a.m.cache.put(rec, ttl-cacheMargin(ttl))
		a.m.putShared(rec, ttl-cacheMargin(ttl)) // Config.SharedCache (shared.go)
	}
	return rec, err
}

// cacheOwn caches a record this process just finished. The store computed
// its expiry at some moment after started, so the entry's clock starts there.
func (m *Middleware) cacheOwn(scope, key, fingerprint string, st Status, snap *Snapshot, started time.Time) {
	ttl := m.cfg.Retention
	ttl -= cacheMargin(ttl) + time.Since(started)
	rec := &Record{Scope: scope, Key: key, Fingerprint: fingerprint, Status: st, Snapshot: snap}
	m.cache.put(rec, ttl)
	m.putShared(rec, ttl) // Config.SharedCache (shared.go)
}

// note reports a step outcome.
func (a *attempt) note(e Event) {
	e.Route, e.KeyHash = a.m.cfg.Route, a.keyHash
	a.m.cfg.Observer.Observe(a.ctx, e)
}

// done reports the request's final outcome and ends its stage.
func (a *attempt) done(e Event) {
	e.Duration, e.Final = time.Since(a.start), true
	a.outcome = e.Outcome
	a.note(e)
	a.endRequest(StageEnd{Outcome: e.Outcome, Err: e.Err, Record: e.Replayed, KeyHash: a.keyHash})
}

// startStage begins a stage if the Observer traces stages.
func (m *Middleware) startStage(ctx context.Context, s Stage) (context.Context, func(StageEnd)) {
	if so, ok := m.cfg.Observer.(StageObserver); ok {
		return so.StartStage(ctx, s, m.cfg.Route)
	}
	return ctx, func(StageEnd) {}
}

// log writes one structured line per notable decision, with the key hashed.
func (m *Middleware) log(level slog.Level, msg, keyHash string, args ...any) {
	if !m.cfg.Logger.Enabled(context.Background(), level) {
		return
	}
	args = append([]any{"route", m.cfg.Route, "key_hash", keyHash}, args...)
	m.cfg.Logger.Log(context.Background(), level, "idempotency: "+msg, args...)
}

// snapshot keeps the status, the allow-listed headers and the body.
func (m *Middleware) snapshot(status int, header http.Header, body []byte) *Snapshot {
	kept := http.Header{}
	for _, name := range m.replayHeaders {
		if v := header.Values(name); len(v) > 0 {
			kept[name] = append([]string(nil), v...)
		}
	}
	return &Snapshot{StatusCode: status, Header: kept, Body: bytes.Clone(body)}
}

// writeReplay answers with a stored snapshot, marked as a replay.
func writeReplay(w http.ResponseWriter, s *Snapshot) {
	w.Header().Set("Idempotent-Replayed", "true")
	writeResponse(w, s.StatusCode, s.Header, s.Body)
}

func writeResponse(w http.ResponseWriter, status int, header http.Header, body []byte) {
	dst := w.Header()
	for k, v := range header {
		dst[k] = slices.Clone(v) // a snapshot may be cached: never share its slices
	}
	dst.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// newOwner is the lease owner of one attempt: the instance id plus a random
// token, so that two attempts of one process never share a lease.
func (m *Middleware) newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return m.cfg.InstanceID + "/" + hex.EncodeToString(b[:])
}

// KeyHash is the short, stable hash of a scope and key used in logs, metrics
// and traces instead of the raw key, which may be sensitive: the first 16 hex
// digits of SHA-256 over both, length-prefixed.
func KeyHash(scope, key string) string {
	var stack [8 + 2*255]byte // every request's key and scope fit: no allocation
	in := binary.BigEndian.AppendUint64(stack[:0], uint64(len(scope)))
	in = append(append(in, scope...), key...)
	sum := sha256.Sum256(in)
	return hex.EncodeToString(sum[:8])
}
