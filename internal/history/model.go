package history

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/orderguard/idempotency"
)

// The sequential model of the HTTP contract, one idempotency key at a time
// (the history is partitioned by key, so the model never sees two keys).
//
// A key's state is whether it has a recorded final answer and, if so, the
// fingerprint of the request that made it and the answer itself (status and
// body), or only that one was committed by an operation whose client never
// heard back. Each operation is a request with its fingerprint and what its
// client got; the model says which answers a request may get in a state and
// what the state becomes:
//
//   - An executed final answer (2xx, 3xx, a final 4xx, not marked
//     Idempotent-Replayed) is legal only while the key has no answer: it
//     becomes the answer. A final 4xx may also go unstored (the library
//     answers a rejection it could not store and releases the key), so the
//     key may stay without one. A second execution after the answer was
//     recorded means a second order or a replaced answer: illegal.
//   - A replay (Idempotent-Replayed: true) must equal the recorded answer,
//     status and body, for the same fingerprint. A replay while the key has
//     no answer is illegal, unless an operation whose outcome is unknown
//     may have committed one; the first replay then shows it.
//   - 409 (or 422) key-reused is legal when the recorded answer has another
//     fingerprint, or, before any answer, when a request with another
//     fingerprint for the key started before this one was answered (its
//     claim may hold the key).
//   - 409 in-progress and 503 with Retry-After say that nothing of the
//     attempt was recorded: legal in any state, which they leave as it was.
//     Without Retry-After they break the contract: illegal.
//   - Answers that record nothing by the contract (400, 408, 425, 429,
//     every other 5xx, the handler's 500, refusals before the claim) leave
//     the state as it was. (The specs' clients talk to the servers
//     directly; a proxy's 502 or 504 would be an unknown outcome.)
//   - A request without an answer (a transport error, a client timeout, a
//     server killed) and 503 commit-outcome-unknown are unknown outcomes, as
//     etcd's robustness tests treat failed requests: the request may or may
//     not have recorded an answer, at any time after it was sent. The model
//     forks into both states, and what comes later decides.
//
// The orders table joins the history as one last observation per key, made
// after every request ended: a key whose recorded answer is a 2xx or 3xx has
// exactly one order, the one the answer names; a key with a final 4xx or
// without an answer has none; a key whose answer came from an unknown
// outcome and was never seen may have one or none; no key has two.

// Request is what one operation sent: the key (scope and idempotency key,
// as one string) and the request's fingerprint (any string that is equal
// for two requests exactly when the middleware fingerprints them equal;
// the body, for the specs' fixed headers).
type Request struct {
	Key         string
	Fingerprint string
}

// Response is what the client of one operation got back.
type Response struct {
	// Err is set when the request got no answer (transport error, client
	// timeout, server killed): its outcome is unknown.
	Err        string
	Status     int
	Body       string
	Replayed   bool   // Idempotent-Replayed: true
	Problem    string // the kind of an application/problem+json answer
	RetryAfter string
}

// input is a porcupine operation's input: a request, or the final look at
// the orders table.
type input struct {
	Request
	// otherFingerprint: a request with another fingerprint for the key
	// started before this one was answered, so its claim may have held the
	// key (what a key-reused answer needs before any answer is recorded).
	otherFingerprint bool
	observe          bool
}

// observation is what the orders table holds for a key.
type observation struct {
	orders string // the order ids, comma-separated
	count  int
}

// state is one possible state of a key. It is comparable: the
// nondeterministic model merges equal states with ==.
type state struct {
	recorded    bool // the key has a final answer
	known       bool // and a client has seen it (else an unknown outcome committed it)
	fingerprint string
	status      int
	body        string
}

// answerKind classifies a response by what it says about the key's record.
type answerKind int

const (
	kindUnknown     answerKind = iota // may or may not have recorded an answer
	kindNothing                       // recorded nothing (retry-later, not final, refused before the claim)
	kindRetryBroken                   // a retry-later without Retry-After: the contract is broken
	kindConflict                      // key-reused
	kindExecuted                      // a final answer this request executed
	kindReplayed                      // a final answer replayed from the record
)

// refusedBeforeClaim are the library's problems answered before anything
// is written.
var refusedBeforeClaim = map[string]bool{
	idempotency.ProblemMissingKey: true, idempotency.ProblemInvalidKey: true,
	idempotency.ProblemInvalidBody: true, idempotency.ProblemBodyTooLarge: true,
	idempotency.ProblemUnsupportedMedia: true, idempotency.ProblemScopeRequired: true,
	idempotency.ProblemExecutionFailed: true,
}

// mutation breaks the model on purpose, to prove that the histories the
// tests doctor are caught because of a rule, not by accident.
type mutation int

const (
	correct               mutation = iota
	mutantTwoExecutions            // a second executed answer replaces the first
	mutantAnyReplay                // a replay need not equal the recorded answer
	mutantReplayFromNone           // a replay is legal with no answer recorded
	mutantOrdersUnchecked          // the orders table may hold anything
)

// model is the contract's model for one run.
type model struct {
	isFinal func(int) bool
	orderOf func(body string) string
	mutant  mutation
}

func (m model) classify(r Response) answerKind {
	switch {
	case r.Err != "" || r.Problem == idempotency.ProblemCommitUnknown:
		if r.Err == "" && r.RetryAfter == "" {
			return kindRetryBroken
		}
		return kindUnknown
	case r.Problem == idempotency.ProblemInProgress || r.Problem == idempotency.ProblemStoreUnavailable:
		if r.RetryAfter == "" {
			return kindRetryBroken
		}
		return kindNothing
	case r.Problem == idempotency.ProblemKeyReused:
		return kindConflict
	case refusedBeforeClaim[r.Problem] || !m.isFinal(r.Status):
		return kindNothing
	case r.Replayed:
		return kindReplayed
	}
	return kindExecuted
}

// step returns every state the key may be in after the operation, none if
// the answer is illegal in s.
func (m model) step(s state, in input, out any) []state {
	if in.observe {
		if m.observe(s, out.(observation)) {
			return []state{s}
		}
		return nil
	}
	r := out.(Response)
	switch m.classify(r) {
	case kindUnknown:
		if s.recorded {
			return []state{s}
		}
		return []state{s, {recorded: true, fingerprint: in.Fingerprint}}
	case kindNothing:
		return []state{s}
	case kindConflict:
		if (s.recorded && s.fingerprint != in.Fingerprint) || (!s.recorded && in.otherFingerprint) {
			return []state{s}
		}
		return nil
	case kindExecuted:
		answered := state{recorded: true, known: true, fingerprint: in.Fingerprint, status: r.Status, body: r.Body}
		switch {
		case s.recorded && m.mutant == mutantTwoExecutions:
			return []state{answered}
		case s.recorded:
			return nil
		case r.Status >= 400: // a rejection may go unstored
			return []state{s, answered}
		}
		return []state{answered}
	case kindReplayed:
		switch {
		case !s.recorded && m.mutant == mutantReplayFromNone:
			return []state{s}
		case !s.recorded || s.fingerprint != in.Fingerprint:
			return nil
		case !s.known:
			s.known, s.status, s.body = true, r.Status, r.Body
			return []state{s}
		case s.status == r.Status && s.body == r.Body, m.mutant == mutantAnyReplay:
			return []state{s}
		}
		return nil
	}
	return nil // kindRetryBroken
}

// observe reports whether the orders table may hold o for a key in s.
func (m model) observe(s state, o observation) bool {
	switch {
	case m.mutant == mutantOrdersUnchecked:
		return true
	case o.count > 1:
		return false
	case !s.recorded:
		return o.count == 0
	case !s.known:
		return true // an unseen answer: an order, or a stored rejection
	case s.status >= 400:
		return o.count == 0
	case o.count != 1:
		return false
	}
	named := m.orderOf(s.body)
	return named == "" || named == o.orders
}

// porcupine is the model as porcupine checks it, partitioned by key.
func (m model) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []any { return []any{state{}} },
		Step: func(s, in, out any) []any {
			var next []any
			for _, n := range m.step(s.(state), in.(input), out) {
				next = append(next, n)
			}
			return next
		},
		DescribeOperation: describeOperation,
		DescribeState:     func(s any) string { return describeState(s.(state)) },
		DescribeOperationMetadata: func(info any) string {
			if info == nil {
				return ""
			}
			return info.(string)
		},
	}
	return nm.ToModel()
}

func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range ops {
		k := op.Input.(input).Key
		i, ok := index[k]
		if !ok {
			i = len(parts)
			index[k] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// short is a fingerprint as the visualization shows it: a few hex digits.
func short(fingerprint string) string {
	h := fnv.New32a()
	h.Write([]byte(fingerprint))
	return fmt.Sprintf("#%06x", h.Sum32()&0xffffff)
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

func describeResponse(r Response) string {
	if r.Err != "" {
		return "no answer: " + clip(r.Err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", r.Status)
	if r.Problem != "" {
		b.WriteString(" " + r.Problem)
	}
	if r.Replayed {
		b.WriteString(" replayed")
	}
	if r.RetryAfter != "" {
		b.WriteString(" Retry-After " + r.RetryAfter)
	}
	if r.Problem == "" && r.Status != 0 {
		b.WriteString(" " + clip(r.Body))
	}
	return b.String()
}

func describeOperation(in, out any) string {
	i := in.(input)
	if i.observe {
		o := out.(observation)
		if o.count == 0 {
			return i.Key + ": orders table holds no order"
		}
		return fmt.Sprintf("%s: orders table holds %d: %s", i.Key, o.count, o.orders)
	}
	return fmt.Sprintf("%s %s → %s", i.Key, short(i.Fingerprint), describeResponse(out.(Response)))
}

func describeState(s state) string {
	switch {
	case !s.recorded:
		return "no answer"
	case !s.known:
		return "an answer committed by an operation whose outcome is unknown, for " + short(s.fingerprint)
	}
	return fmt.Sprintf("answer for %s: %d %s", short(s.fingerprint), s.status, clip(s.body))
}
