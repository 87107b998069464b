package idempotency

import (
	"context"
	"fmt"
)

// Action is one request for an idempotent action, as its front-end read it
// from its transport: who asks, under which key, for what. Two requests are
// the same action when all three are equal; the same scope and key with
// another fingerprint is a conflict, never a second execution.
type Action struct {
	// Scope is the principal that owns the key: the authenticated user,
	// tenant or client, spelled one way (see Config.ScopeFunc). At most 255
	// bytes.
	Scope string
	// Key is the caller's idempotency key, the same for every retry of one
	// action: 1 to 255 bytes (ParseKey checks a header's syntax).
	Key string
	// Fingerprint identifies the action's business parameters, 1 to 128
	// bytes: NewFingerprint's hex SHA-256 over HTTP requests, or any stable
	// digest a front-end computes over its request (FingerprintJSON).
	Fingerprint string
}

// check refuses an action the store cannot record, before anything is
// written: a key out of bounds, a scope or fingerprint too long or holding
// bytes the store's dialect cannot hold (TextChecker).
func (m *Middleware) check(a Action) error {
	if a.Key == "" || len(a.Key) > maxKeyBytes {
		return fmt.Errorf("%w: %d bytes, want 1..%d", ErrInvalidKey, len(a.Key), maxKeyBytes)
	}
	if check := checkText(m.store); check != nil {
		if err := check(a.Key); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
	}
	if err := m.scopeFits(a.Scope); err != nil {
		return NewProblem(401, ProblemScopeRequired, "Unauthenticated", err.Error())
	}
	return m.fingerprintFits(a.Fingerprint)
}

// RunFunc runs an action once, inside the record's transaction: it does
// every write of the action in the transaction TxFromContext(ctx) returns,
// and neither commits nor rolls it back; the protocol commits it together
// with the record of the answer, or rolls it back. ctx also carries the key
// (KeyFromContext) and the lease (ExtendLease), and ends shortly before the
// lease does.
//
// In ModeSinglePhase one Do may run the action more than once, each run in
// a new transaction after the last was rolled back (the database refused
// it, or the key is renewed past its retention): a run must leave no effect
// outside its transaction. A panic is recovered: the transaction is rolled
// back, the key released, and the answer is ErrHandlerFailed's problem.
type RunFunc func(ctx context.Context) Result

// Result is what one run of an action answered, in HTTP's terms whatever
// the transport (a front-end maps its own codes to statuses and back):
//   - a 2xx or 3xx commits the transaction with the record of the answer;
//   - a final status (Config.IsFinalFunc: by default every other status
//     below 500 except 400, 408, 425 and 429) rolls the transaction back and
//     records the answer, which every retry gets again;
//   - any other status rolls back and releases the key: the answer is
//     passed on and a retry executes again.
type Result struct {
	Status int
	// Header is the answer's metadata (HTTP headers, gRPC metadata, message
	// headers), keys in http.CanonicalHeaderKey form. The record keeps
	// Content-Type, Location, ETag and Config.ReplayHeaders; the first answer
	// carries all of it.
	Header map[string][]string
	Body   []byte

	// TooLarge reports that the answer's body outgrew
	// Config.MaxSnapshotBytes, so it cannot be recorded: the run is rolled
	// back and answered as ErrHandlerFailed.
	TooLarge bool

	// Abort, when set, asks that nothing be answered (net/http's
	// http.ErrAbortHandler): the run is rolled back, the key released, and
	// Answer.Abort carries the value back to the front-end.
	Abort any
}

// Answer is the protocol's answer to an action, for the front-end to send
// in its own terms. Exactly one of three holds: Problem is set (the
// protocol answered itself: bad input, a conflict, in progress, an
// infrastructure fault, a failed run); Abort is set; or Status, Header and
// Body are the action's answer: this call's run, or, with Replayed, the
// recorded first answer.
type Answer struct {
	Status int
	Header map[string][]string
	Body   []byte
	// Replayed says the answer is the record's, not this call's run: send
	// it marked (Idempotent-Replayed: true over HTTP).
	Replayed bool
	// Source says where a replay came from.
	Source ReplaySource

	// Problem is the protocol's own answer, with the status and type an
	// HTTP client gets; Problem.RetryAfter, when positive, says when a retry
	// may succeed (in progress, an infrastructure fault, an unknown commit).
	Problem *Problem

	// Abort is Result.Abort of the run that asked for it.
	Abort any
}

// answerWith sets the answer to a run's own answer.
func (a *attempt) answerWith(status int, header map[string][]string, body []byte) {
	a.answer = Answer{Status: status, Header: header, Body: body}
}

// answerReplay sets the answer to a recorded snapshot.
func (a *attempt) answerReplay(s *Snapshot, from ReplaySource) {
	a.answer = Answer{Status: s.StatusCode, Header: s.Header, Body: s.Body, Replayed: true, Source: from}
}

// answerProblem sets the answer to the protocol's own.
func (a *attempt) answerProblem(p *Problem) { a.answer = Answer{Problem: p} }
