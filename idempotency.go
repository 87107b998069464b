package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// Config configures a Middleware. The zero value is usable: every field has
// a default.
type Config struct {
	// Route names the protected route in observations (a bounded label such
	// as "create_order"). Defaults to "default".
	Route string

	// HeaderName is the request header carrying the key. Defaults to
	// "Idempotency-Key".
	HeaderName string

	// MaxKeyLength bounds the key's length. Defaults to 255, the most the
	// schema stores.
	MaxKeyLength int

	// KeyOptional lets requests without a key through, unprotected. Defaults
	// to false: a missing key is answered 400.
	KeyOptional bool

	// ScopeFunc returns the principal (user, tenant, API client) that owns
	// the request's key. Records are unique per (scope, key): a request from
	// another scope never sees, blocks or replays this scope's records. An
	// error is answered 401 (or as the *Problem it wraps). Defaults to the
	// empty scope for every request, which is safe for single-tenant services
	// only.
	ScopeFunc func(*http.Request) (string, error)

	// Fingerprint selects what the default fingerprint covers. Ignored when
	// FingerprintFunc is set. Defaults to method, canonical route and the
	// whole body.
	Fingerprint FingerprintConfig

	// FingerprintFunc replaces the default fingerprint.
	FingerprintFunc FingerprintFunc

	// MaxBodyBytes bounds the request body, which is read (through a limit)
	// before the claim to compute the fingerprint. Defaults to 1 MiB.
	MaxBodyBytes int64

	// MaxSnapshotBytes bounds a stored response body. A 2xx response larger
	// than this cannot be replayed, so the attempt is rolled back and
	// answered 500. Defaults to 1 MiB.
	MaxSnapshotBytes int

	// Lease is how long a PROCESSING claim is held before another attempt may
	// take it over. The handler's context is cancelled a tenth earlier.
	// Defaults to 30s.
	Lease time.Duration

	// Retention is how long a record lives; after it the key is new again.
	// Defaults to 24h.
	Retention time.Duration

	// IsFinalFunc decides which handler statuses are final outcomes that are
	// stored and replayed. A 2xx is committed with the business transaction;
	// a final non-2xx (a business rejection such as 422) rolls the
	// transaction back and is stored as FAILED; a non-final status rolls back
	// and releases the key so that a retry executes again. Defaults to
	// status < 500.
	IsFinalFunc func(status int) bool

	// ConflictStatus answers a key reused with a different fingerprint: 409
	// (the seed's rule) or 422 (the IETF draft's). Defaults to 409.
	ConflictStatus int

	// ReplayHeaders lists response headers stored and replayed besides
	// Content-Type, Location and ETag. Set-Cookie, Date and authentication
	// headers are refused. Defaults to none.
	ReplayHeaders []string

	// RetryAfter is sent with in-progress answers. Defaults to 1s.
	RetryAfter time.Duration

	// InFlightWait is how long a duplicate that finds its key PROCESSING
	// waits for the original to finish, to replay its answer instead of
	// answering in-progress. Waiters on this instance wake the moment the
	// original finishes; waiters on other instances poll the store. Defaults
	// to 0: answer in-progress at once.
	InFlightWait time.Duration

	// InstanceID names this process in lease owners (locked_by). Defaults to
	// hostname-pid.
	InstanceID string

	// Observer receives every outcome. Defaults to none.
	Observer Observer
}

// Middleware makes a handler idempotent. Create it with New.
type Middleware struct {
	store         Store
	cfg           Config
	fingerprint   FingerprintFunc
	replayHeaders []string
	isFinal       func(int) bool
	inflight      inflight
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
	m := &Middleware{store: store, cfg: c, isFinal: c.IsFinalFunc}
	m.fingerprint = c.FingerprintFunc
	if m.fingerprint == nil {
		m.fingerprint = NewFingerprint(c.Fingerprint)
	}
	m.replayHeaders = append([]string{"Content-Type", "Location", "Etag"}, c.ReplayHeaders...)
	for i, h := range m.replayHeaders {
		m.replayHeaders[i] = http.CanonicalHeaderKey(h)
	}
	m.inflight.waiters = map[string]chan struct{}{}
	return m, nil
}

func (c Config) withDefaults() Config {
	if c.Route == "" {
		c.Route = "default"
	}
	if c.HeaderName == "" {
		c.HeaderName = "Idempotency-Key"
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = 255
	}
	if c.ScopeFunc == nil {
		c.ScopeFunc = func(*http.Request) (string, error) { return "", nil }
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MaxSnapshotBytes == 0 {
		c.MaxSnapshotBytes = 1 << 20
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.IsFinalFunc == nil {
		c.IsFinalFunc = func(status int) bool { return status < 500 }
	}
	if c.ConflictStatus == 0 {
		c.ConflictStatus = http.StatusConflict
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return c
}

// forbiddenReplayHeaders may never be replayed: they belong to one response
// or one principal, not to the stored outcome.
var forbiddenReplayHeaders = map[string]bool{
	"Set-Cookie": true, "Date": true, "Authorization": true, "Www-Authenticate": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Cookie": true,
	"Content-Length": true, "Idempotent-Replayed": true,
}

func (c Config) validate() error {
	switch {
	case c.MaxKeyLength < 1 || c.MaxKeyLength > 255:
		return fmt.Errorf("idempotency: MaxKeyLength %d: want 1..255, the most the schema stores", c.MaxKeyLength)
	case c.MaxBodyBytes < 0:
		return errors.New("idempotency: MaxBodyBytes must not be negative")
	case c.MaxSnapshotBytes < 0 || c.MaxSnapshotBytes > 16<<20:
		return errors.New("idempotency: MaxSnapshotBytes must be 0..16 MiB (the MEDIUMBLOB column)")
	case c.Lease < time.Second:
		return fmt.Errorf("idempotency: Lease %v: want at least 1s", c.Lease)
	case c.Retention < c.Lease:
		return fmt.Errorf("idempotency: Retention %v is shorter than Lease %v", c.Retention, c.Lease)
	case c.ConflictStatus != http.StatusConflict && c.ConflictStatus != http.StatusUnprocessableEntity:
		return fmt.Errorf("idempotency: ConflictStatus %d: want 409 or 422", c.ConflictStatus)
	case c.RetryAfter < 0 || c.InFlightWait < 0:
		return errors.New("idempotency: RetryAfter and InFlightWait must not be negative")
	case len(c.InstanceID) > 64:
		return errors.New("idempotency: InstanceID longer than 64 bytes")
	}
	for _, h := range c.ReplayHeaders {
		if forbiddenReplayHeaders[http.CanonicalHeaderKey(h)] {
			return fmt.Errorf("idempotency: ReplayHeaders: %s must never be replayed", h)
		}
	}
	return nil
}

// Handler wraps next, the create-order (or any non-idempotent) handler. next
// runs at most once per (scope, key) and fingerprint; it finds its
// transaction with TxFromContext.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// request is one request's way through the protocol.
type request struct {
	start       time.Time
	scope       string
	key         string
	fingerprint string
	body        []byte
}

// serve is the protocol, one stage per step.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	req := &request{start: time.Now()}
	ctx := r.Context()

	// 1. Key.
	key, err := m.readKey(r)
	if errors.Is(err, ErrMissingKey) && m.cfg.KeyOptional {
		next.ServeHTTP(w, r)
		m.report(ctx, req, Event{Outcome: OutcomeUnprotected})
		return
	}
	if err != nil {
		m.reject(w, r, req, err)
		return
	}
	req.key = key

	// 2. Scope.
	if req.scope, err = m.cfg.ScopeFunc(r); err != nil {
		var p *Problem
		if !errors.As(err, &p) {
			p = NewProblem(http.StatusUnauthorized, ProblemScopeRequired, "Unauthenticated", err.Error())
		}
		m.reject(w, r, req, p)
		return
	}

	// 3. Fingerprint.
	if err := m.readFingerprint(r, req); err != nil {
		m.reject(w, r, req, err)
		return
	}

	// 4. Claim.
	lease, rec, err := m.claim(ctx, req)
	switch {
	case err != nil:
		m.fail(w, r, req, OutcomeStoreError, err)
		return
	case rec != nil:
		m.respondToDuplicate(w, r, req, rec)
		return
	}

	// 5. Execute, 6. finalize, 7. respond.
	m.execute(w, r, req, lease, next)
}

// readKey is step 1: the key header, in plain or RFC 8941 sf-string form.
func (m *Middleware) readKey(r *http.Request) (string, error) {
	values := r.Header.Values(m.cfg.HeaderName)
	switch {
	case len(values) == 0 || (len(values) == 1 && values[0] == ""):
		return "", ErrMissingKey
	case len(values) > 1:
		return "", fmt.Errorf("%w: send exactly one %s header", ErrInvalidKey, m.cfg.HeaderName)
	}
	return ParseKey(values[0], m.cfg.MaxKeyLength)
}

// readFingerprint is step 3. It reads the body through MaxBodyBytes, so an
// oversized body is refused without being held in memory, and replaces
// r.Body with the bytes read so the handler sees the same body.
func (m *Middleware) readFingerprint(r *http.Request, req *request) error {
	if r.ContentLength > m.cfg.MaxBodyBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, r.ContentLength, m.cfg.MaxBodyBytes)
	}
	if r.Body != nil && r.Body != http.NoBody {
		body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
		if err != nil {
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				return fmt.Errorf("%w: %v", ErrBodyTooLarge, err)
			}
			return fmt.Errorf("%w: %v", ErrInvalidBody, err)
		}
		if int64(len(body)) > m.cfg.MaxBodyBytes {
			return fmt.Errorf("%w: limit %d bytes", ErrBodyTooLarge, m.cfg.MaxBodyBytes)
		}
		req.body = body
	}
	r.Body = io.NopCloser(bytes.NewReader(req.body))
	r.ContentLength = int64(len(req.body))

	fp, err := m.fingerprint(r, req.body)
	if err != nil {
		return err
	}
	// A custom FingerprintFunc may have consumed r.Body.
	r.Body = io.NopCloser(bytes.NewReader(req.body))
	if len(fp) == 0 || len(fp) > 128 {
		return fmt.Errorf("idempotency: fingerprint must be 1..128 bytes, got %d", len(fp))
	}
	req.fingerprint = fp
	return nil
}

// maxClaimRounds bounds how often a request re-reads a key whose record
// vanishes (released or purged) or changes under it before it gives up.
const maxClaimRounds = 4

// claim is step 4: a plain INSERT in autocommit. On a duplicate key the
// existing record is read with a fresh statement (a transaction's snapshot
// could hide the winner) and either taken over, when its lease or retention
// has expired, or returned for respondToDuplicate.
func (m *Middleware) claim(ctx context.Context, req *request) (Lease, *Record, error) {
	c := Claim{
		Scope: req.scope, Key: req.key, Fingerprint: req.fingerprint,
		Owner: m.newOwner(), Lease: m.cfg.Lease, Retention: m.cfg.Retention,
	}
	var rec *Record
	for range maxClaimRounds {
		lease, err := m.store.Claim(ctx, c)
		if err == nil {
			m.observer().Observe(ctx, Event{Route: m.cfg.Route, Outcome: OutcomeClaimed})
			return lease, nil, nil
		}
		if !errors.Is(err, ErrKeyClaimed) {
			return Lease{}, nil, err
		}
		if rec, err = m.store.Lookup(ctx, req.scope, req.key); errors.Is(err, ErrRecordNotFound) {
			continue // released or purged since our INSERT: claim again
		} else if err != nil {
			return Lease{}, nil, err
		}
		if !rec.Expired && !(rec.Status == StatusProcessing && rec.LeaseExpired && rec.Fingerprint == req.fingerprint) {
			return Lease{}, rec, nil
		}
		lease, err = m.store.TakeOver(ctx, c, rec.Version)
		if err == nil {
			m.observer().Observe(ctx, Event{Route: m.cfg.Route, Outcome: OutcomeTakenOver})
			return lease, nil, nil
		}
		if !errors.Is(err, ErrLeaseLost) {
			return Lease{}, nil, err
		}
		// Another duplicate took it over first: read its state again.
	}
	if rec == nil {
		return Lease{}, nil, errors.New("idempotency: claim: the key's record kept changing")
	}
	return Lease{}, rec, nil
}

// execute is step 5: run the handler inside a transaction with a recording
// writer. The transaction runs on a context detached from the client's: an
// agent whose gateway timed out has usually gone away, and the order it asked
// for should still commit so that its retry replays it. The lease bounds it.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, req *request, lease Lease, next http.Handler) {
	done := m.inflight.begin(req.scope, req.key)
	defer done()

	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	exec := &execution{
		store: m.store, lease: lease, key: req.key, scope: req.scope, leaseD: m.cfg.Lease,
		deadline: time.AfterFunc(handlerBudget(m.cfg.Lease), cancel),
	}
	defer exec.deadline.Stop()

	tx, err := m.store.BeginTx(ctx)
	if err != nil {
		m.release(ctx, w, r, req, lease, err)
		return
	}
	exec.tx = tx
	rec := newRecorder(w, m.cfg.MaxSnapshotBytes)
	panicked := m.runHandler(next, rec, r.WithContext(context.WithValue(ctx, contextKey{}, exec)))

	// 6. Finalize.
	status, header := rec.result()
	switch {
	case panicked == http.ErrAbortHandler:
		_ = tx.Rollback()
		_ = m.store.Release(ctx, lease)
		panic(panicked) // net/http aborts the response, as the handler asked
	case panicked != nil:
		_ = tx.Rollback()
		m.release(ctx, w, r, req, lease, fmt.Errorf("idempotency: handler panicked: %v", panicked))
	case rec.overflowed:
		_ = tx.Rollback()
		m.release(ctx, w, r, req, lease, fmt.Errorf("idempotency: response body over MaxSnapshotBytes (%d)", m.cfg.MaxSnapshotBytes))
	case status >= 200 && status < 300 && m.isFinal(status):
		m.commit(ctx, w, r, req, lease, tx, m.snapshot(status, header, rec.body.Bytes()), header)
	case m.isFinal(status):
		_ = tx.Rollback()
		m.storeRejection(ctx, w, r, req, lease, m.snapshot(status, header, rec.body.Bytes()), header)
	default:
		_ = tx.Rollback()
		m.releaseAndPassThrough(ctx, w, r, req, lease, status, header, rec.body.Bytes())
	}
}

// runHandler calls next and turns a panic into a value, so that the
// transaction is rolled back and the key released.
func (m *Middleware) runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (panicked any) {
	defer func() {
		panicked = recover()
	}()
	next.ServeHTTP(w, r)
	return nil
}

// commit is step 6 for a 2xx: finish the record with the snapshot inside the
// business transaction, then commit. The order rows and the snapshot commit
// together or not at all; the client hears nothing before the commit.
func (m *Middleware) commit(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, lease Lease, tx *sql.Tx, snap *Snapshot, header http.Header) {
	finished, err := m.store.FinishTx(ctx, tx, lease, StatusDone, snap, m.cfg.Retention)
	if err != nil {
		_ = tx.Rollback()
		if errors.Is(err, ErrLeaseLost) {
			m.answerCurrentOwner(ctx, w, r, req, err)
			return
		}
		m.release(ctx, w, r, req, lease, err)
		return
	}
	if err := tx.Commit(); err != nil {
		m.resolveCommit(ctx, w, r, req, lease, finished, snap, header, err)
		return
	}
	writeResponse(w, snap.StatusCode, header, snap.Body)
	m.report(ctx, req, Event{Outcome: OutcomeCommitted, Status: snap.StatusCode})
}

// resolveCommit decides what a failed COMMIT did. A server error means it
// did not commit, but a dropped connection leaves the outcome unknown, so in
// both cases the record is read again on a fresh connection: finished by our
// lease means the order committed; still held by our lease means it did not;
// anything else means another attempt owns the key now.
func (m *Middleware) resolveCommit(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, lease, finished Lease, snap *Snapshot, header http.Header, commitErr error) {
	rec, err := m.store.Lookup(ctx, req.scope, req.key)
	switch {
	case err != nil && !errors.Is(err, ErrRecordNotFound):
		// We cannot tell. The record stays PROCESSING (if it did not commit)
		// until its lease expires, so a retry can never execute twice.
		m.fail(w, r, req, OutcomeUnknown, fmt.Errorf("%w: commit: %v; re-read: %v", ErrCommitUnknown, commitErr, err))
	case err == nil && rec.Status.Final() && rec.Owner == finished.Owner && rec.Version == finished.Version:
		writeResponse(w, snap.StatusCode, header, snap.Body)
		m.report(ctx, req, Event{Outcome: OutcomeCommitted, Status: rec.Snapshot.StatusCode})
	case err == nil && rec.Status == StatusProcessing && rec.Owner == lease.Owner && rec.Version == lease.Version:
		m.release(ctx, w, r, req, lease, fmt.Errorf("idempotency: commit: %w", commitErr))
	default:
		m.answerCurrentOwner(ctx, w, r, req, fmt.Errorf("idempotency: commit: %w", commitErr))
	}
}

// storeRejection is step 6 for a final non-2xx (a business rejection such as
// an unknown SKU): the business transaction is already rolled back; the
// answer is stored as FAILED so that every retry gets it again.
func (m *Middleware) storeRejection(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, lease Lease, snap *Snapshot, header http.Header) {
	_, err := m.store.Finish(ctx, lease, StatusFailed, snap, m.cfg.Retention)
	switch {
	case errors.Is(err, ErrLeaseLost):
		m.answerCurrentOwner(ctx, w, r, req, err)
		return
	case err != nil:
		// The rejection is the true answer and nothing was written, so the
		// client still gets it; the key is released so that a retry decides
		// again rather than waiting out the lease.
		_ = m.store.Release(ctx, lease)
		m.observer().Observe(ctx, Event{Route: m.cfg.Route, Outcome: OutcomeStoreError, Err: err})
	}
	writeResponse(w, snap.StatusCode, header, snap.Body)
	m.report(ctx, req, Event{Outcome: OutcomeRejected, Status: snap.StatusCode})
}

// releaseAndPassThrough handles a non-final status (5xx by default): nothing
// is stored and the key is released, so a retry executes again. The client
// gets the handler's own answer.
func (m *Middleware) releaseAndPassThrough(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, lease Lease, status int, header http.Header, body []byte) {
	if err := m.store.Release(ctx, lease); err != nil && !errors.Is(err, ErrLeaseLost) {
		m.observer().Observe(ctx, Event{Route: m.cfg.Route, Outcome: OutcomeStoreError, Err: err})
	}
	writeResponse(w, status, header, body)
	m.report(ctx, req, Event{Outcome: OutcomeReleased, Status: status})
}

// release rolls an attempt back after an error: the key is released (fenced,
// so a late attempt never deletes its successor's claim) and the client is
// answered 500. A retry with the same key executes again.
func (m *Middleware) release(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, lease Lease, cause error) {
	if err := m.store.Release(ctx, lease); err != nil && !errors.Is(err, ErrLeaseLost) {
		cause = fmt.Errorf("%w; release: %v", cause, err)
	}
	p := problemFor(cause, m.cfg.ConflictStatus)
	WriteProblem(w, p)
	m.report(ctx, req, Event{Outcome: OutcomeReleased, Status: p.Status, Err: cause})
}

// answerCurrentOwner answers an attempt that lost its lease: it rolled back,
// and the client hears whatever the key's current state says.
func (m *Middleware) answerCurrentOwner(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, cause error) {
	m.observer().Observe(ctx, Event{Route: m.cfg.Route, Outcome: OutcomeLeaseLost, Err: cause})
	rec, err := m.store.Lookup(ctx, req.scope, req.key)
	if err != nil {
		// Released, or unreadable: nothing of ours committed; a retry decides.
		m.fail(w, r, req, OutcomeStoreError, fmt.Errorf("idempotency: lease lost, then: %w", err))
		return
	}
	m.respondToDuplicate(w, r, req, rec)
}

// respondToDuplicate is step 7: a request whose key is already held or
// finished. A different fingerprint is a conflict; a final record is
// replayed; a PROCESSING record is in progress (after waiting up to
// InFlightWait for it to finish).
func (m *Middleware) respondToDuplicate(w http.ResponseWriter, r *http.Request, req *request, rec *Record) {
	ctx := r.Context()
	if rec.Status == StatusProcessing && rec.Fingerprint == req.fingerprint && m.cfg.InFlightWait > 0 {
		rec = m.waitForFinal(ctx, req, rec)
	}
	switch {
	case rec.Fingerprint != req.fingerprint:
		m.reject(w, r, req, ErrFingerprintMismatch)
	case rec.Status.Final() && rec.Snapshot != nil:
		writeReplay(w, rec.Snapshot)
		m.report(ctx, req, Event{Outcome: OutcomeReplayed, Status: rec.Snapshot.StatusCode, Replayed: rec.Status})
	default:
		p := problemFor(ErrInProgress, m.cfg.ConflictStatus)
		p.RetryAfter = int(math.Ceil(m.cfg.RetryAfter.Seconds()))
		WriteProblem(w, p)
		m.report(ctx, req, Event{Outcome: OutcomeInProgress, Status: p.Status})
	}
}

// waitForFinal waits up to InFlightWait for a PROCESSING record to become
// final. It wakes at once when the attempt runs on this instance and polls the
// store with backoff otherwise.
func (m *Middleware) waitForFinal(ctx context.Context, req *request, rec *Record) *Record {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.InFlightWait)
	defer cancel()
	poll := 10 * time.Millisecond
	for rec.Status == StatusProcessing {
		wake := m.inflight.wait(req.scope, req.key)
		timer := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return rec
		case <-wake:
		case <-timer.C:
			poll = min(2*poll, 250*time.Millisecond)
		}
		timer.Stop()
		next, err := m.store.Lookup(ctx, req.scope, req.key)
		if err != nil {
			return rec // released or unreadable: answer in-progress, the client retries
		}
		rec = next
	}
	return rec
}

// reject answers bad input (and conflicts) before anything is written.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, req *request, err error) {
	p := problemFor(err, m.cfg.ConflictStatus)
	WriteProblem(w, p)
	outcome := OutcomeInvalid
	if errors.Is(err, ErrFingerprintMismatch) {
		outcome = OutcomeConflict
	}
	m.report(r.Context(), req, Event{Outcome: outcome, Status: p.Status})
}

// fail answers a store failure.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, req *request, outcome Outcome, err error) {
	p := problemFor(err, m.cfg.ConflictStatus)
	if p.Kind() == ProblemExecutionFailed {
		p = NewProblem(http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
			"Nothing was executed for this key. Retry with the same key.")
	}
	WriteProblem(w, p)
	m.report(r.Context(), req, Event{Outcome: outcome, Status: p.Status, Err: err})
}

func (m *Middleware) report(ctx context.Context, req *request, e Event) {
	e.Route = m.cfg.Route
	e.Duration = time.Since(req.start)
	m.observer().Observe(ctx, e)
}

func (m *Middleware) observer() Observer { return m.cfg.Observer }

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
		dst[k] = v
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

// inflight tracks the keys this instance is executing, so that waiting
// duplicates wake the moment the original finishes.
type inflight struct {
	mu      sync.Mutex
	waiters map[string]chan struct{}
}

func inflightKey(scope, key string) string { return strconv.Itoa(len(scope)) + ":" + scope + key }

// begin registers an execution; the returned func wakes its waiters.
func (f *inflight) begin(scope, key string) func() {
	k := inflightKey(scope, key)
	ch := make(chan struct{})
	f.mu.Lock()
	f.waiters[k] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.waiters[k] == ch {
			delete(f.waiters, k)
		}
		f.mu.Unlock()
		close(ch)
	}
}

// wait returns a channel closed when this instance's execution of the key
// ends, or nil (never ready) when the key executes elsewhere.
func (f *inflight) wait(scope, key string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiters[inflightKey(scope, key)]
}
