package chaintest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/orderguard/idempotency"
)

// comparedHeaders are the response headers a chain's answer is compared on:
// what its steps set, and what the middleware adds to its own answers.
var comparedHeaders = []string{"Content-Type", "Location", "X-Chain", "X-Chain-Outer", "Retry-After"}

// Result is what one request of a chain did.
type Result struct {
	Status int
	Header http.Header // comparedHeaders only
	Body   []byte
	// Orders are the committed orders, as "run/step": the run that wrote
	// each and the step that created it.
	Orders []string
	// Trace is what the front's steps did, then what the last run's did.
	Trace []string
	// Runs is how many runs of the chain the middleware started (1 for a
	// plain chain, which stands for one run).
	Runs int
	// AbortedBefore: a run before the last ended aborted (gin).
	AbortedBefore bool
	// Replayed is the Idempotent-Replayed header.
	Replayed string
}

func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %q", r.Status, r.Body)
	for _, h := range comparedHeaders {
		if v := r.Header.Values(h); len(v) > 0 {
			fmt.Fprintf(&b, " %s=%q", h, v)
		}
	}
	fmt.Fprintf(&b, " orders=%v trace=%v", r.Orders, r.Trace)
	if r.Runs > 1 {
		fmt.Fprintf(&b, " runs=%d aborted-before=%v", r.Runs, r.AbortedBefore)
	}
	if r.Replayed != "" {
		fmt.Fprintf(&b, " replayed=%s", r.Replayed)
	}
	return b.String()
}

// problem returns the kind of r's problem+json answer, or "".
func (r Result) problem() string {
	if r.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	if json.Unmarshal(r.Body, &p) != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

// escapedPanic reports whether a step of the last run panicked and no
// recovery behind the middleware caught it: the panic reached whatever is
// in front of the protected steps.
func (r Result) escapedPanic() bool {
	panics, recovered := 0, 0
	for _, ev := range r.Trace {
		switch {
		case strings.HasPrefix(ev, "o"):
		case strings.HasSuffix(ev, ":panic"):
			panics++
		case strings.HasSuffix(ev, ":recovered"):
			recovered++
		}
	}
	return panics > recovered
}

// Divergence is an answer the protected chain may give in place of the
// plain chain's, because the middleware or the adapter documents it. Every
// one refuses: it commits nothing.
type Divergence struct {
	Name string
	// Applies reports whether got, the protected chain's result, is this
	// documented answer where the plain chain gave want.
	Applies func(got, want Result) bool
}

// PanicAnsweredByMiddleware: a panic behind the middleware that no
// recovery behind it catches is the handler's failure: rolled back, key
// released, 500 execution-failed, whatever the framework's recovery in
// front would have answered (and whatever the steps wrote before it).
var PanicAnsweredByMiddleware = Divergence{
	Name: "panic answered 500 execution-failed by the middleware",
	Applies: func(got, want Result) bool {
		return want.escapedPanic() && got.Status == http.StatusInternalServerError &&
			got.problem() == idempotency.ProblemExecutionFailed && slices.Equal(got.Trace, want.Trace)
	},
}

// RerunRefused: a front-end that cannot run the chain again the way its
// framework would (gin after a run that aborted) refuses the run:
// idempotency.ErrRerunRefused, 503 rerun-refused with Retry-After.
var RerunRefused = Divergence{
	Name: "run after an aborted run refused 503 rerun-refused",
	Applies: func(got, _ Result) bool {
		return got.Runs > 1 && got.AbortedBefore && got.Status == http.StatusServiceUnavailable &&
			got.problem() == idempotency.ProblemRerunRefused && got.Header.Get("Retry-After") != ""
	},
}

// compare returns "" when got is want, the name of the divergence when got
// is one of allowed, or what differs. A divergence commits nothing.
func compare(got, want Result, allowed []Divergence) (divergence string, mismatch error) {
	var diffs []string
	if got.Status != want.Status {
		diffs = append(diffs, fmt.Sprintf("status %d, plain %d", got.Status, want.Status))
	}
	if !bytes.Equal(got.Body, want.Body) {
		diffs = append(diffs, fmt.Sprintf("body %q, plain %q", got.Body, want.Body))
	}
	for _, h := range comparedHeaders {
		if g, w := got.Header.Values(h), want.Header.Values(h); !slices.Equal(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s %q, plain %q", h, g, w))
		}
	}
	if !slices.Equal(got.Orders, want.Orders) {
		diffs = append(diffs, fmt.Sprintf("orders %v, plain %v", got.Orders, want.Orders))
	}
	if !slices.Equal(got.Trace, want.Trace) {
		diffs = append(diffs, fmt.Sprintf("trace %v, plain %v", got.Trace, want.Trace))
	}
	if len(diffs) == 0 {
		return "", nil
	}
	if len(got.Orders) == 0 { // a documented refusal commits nothing
		for _, d := range allowed {
			if d.Applies(got, want) {
				return d.Name, nil
			}
		}
	}
	return "", fmt.Errorf("the protected chain differs from the framework alone: %s", strings.Join(diffs, "; "))
}

// compareReplay checks a replay of a final answer: the same status, body
// and headers, marked, and nothing run.
func compareReplay(replay, first Result) error {
	var diffs []string
	if replay.Status != first.Status || !bytes.Equal(replay.Body, first.Body) {
		diffs = append(diffs, fmt.Sprintf("%d %q, first %d %q", replay.Status, replay.Body, first.Status, first.Body))
	}
	for _, h := range comparedHeaders {
		if g, w := replay.Header.Values(h), first.Header.Values(h); !slices.Equal(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s %q, first %q", h, g, w))
		}
	}
	if replay.Replayed != "true" {
		diffs = append(diffs, fmt.Sprintf("Idempotent-Replayed %q", replay.Replayed))
	}
	if replay.Runs != 0 || len(replay.Orders) != 0 {
		diffs = append(diffs, fmt.Sprintf("ran the chain %d times, orders %v", replay.Runs, replay.Orders))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("the replay of a final answer differs from it: %s", strings.Join(diffs, "; "))
}
