// Package chaintest is the differential test of the framework adapters:
// it generates middleware chains (guards that refuse with and without
// writing, errors left to the framework's error rendering, panics, writes
// before and after calling the rest of the chain, early returns, the create
// handler) and checks that a chain served behind an idempotency.Middleware
// answers, writes and calls what the same chain served by the framework
// alone does, on its first run and on every run again (single-phase).
//
// It knows no framework. An adapter's test maps each Step to its
// framework's idiom and gives Run, per chain, the plain handler and the
// protected one (Front); Run drives them over a real MariaDB database,
// forces runs again, compares, shrinks a failing chain and prints how to
// run it again. A behaviour every front-end must show belongs here, once.
package chaintest

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
)

// Kind is what a Step does. Each front-end writes it in its framework's
// idiom; the comments give gin's and echo's.
type Kind uint8

const (
	// Pass calls the rest of the chain (gin: c.Next() where the handler
	// may call it, else returns and gin goes on; echo: next(c)).
	Pass Kind = iota
	// Return returns without calling the rest and without writing (gin
	// goes on with the next handler anyway; echo ends the chain, 200).
	Return
	// GuardWrite refuses with a written answer (Variant 0: a JSON body,
	// gin's c.AbortWithStatusJSON, echo's c.JSON; Variant 1: a status
	// alone, gin's c.AbortWithStatus, echo's c.String).
	GuardWrite
	// GuardStatus refuses with a status and nothing written (gin:
	// c.Status(s); c.Abort(); echo, which writes at once: c.NoContent).
	GuardStatus
	// GuardError refuses with an error left to the framework's error
	// rendering (gin: c.Error(err); c.Abort() with a renderer in front;
	// echo: return echo.NewHTTPError).
	GuardError
	// Panic panics.
	Panic
	// WriteBefore adds a header (Variant 1: and writes a body fragment),
	// then calls the rest.
	WriteBefore
	// WriteAfter calls the rest, then adds a header and writes a body
	// fragment.
	WriteAfter
	// Recover is the framework's recovery middleware (gin.Recovery,
	// echo's middleware.Recover) placed at this point of the chain.
	Recover
	// Create writes an order in the request's transaction and answers 201
	// with Location (Variant 0: JSON; 1: gin's c.AbortWithStatusJSON, or
	// echo's JSON then next(c); 2: a bodiless 201).
	Create
)

var kindNames = [...]string{
	Pass: "pass", Return: "return", GuardWrite: "guard-write", GuardStatus: "guard-status",
	GuardError: "guard-error", Panic: "panic", WriteBefore: "write-before", WriteAfter: "write-after",
	Recover: "recover", Create: "create",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Step is one handler or middleware of a chain.
type Step struct {
	// Label names the step in traces and order numbers: "o1" is the
	// second step in front of the middleware, "i0" the first behind it.
	Label   string
	Kind    Kind
	Status  int // GuardWrite, GuardStatus, GuardError: the refusal's status
	From    int // guards: the first run that refuses (1: every run; 2: runs after the first)
	Variant int // an idiom among equivalent ones (see Kind)
}

// Outer reports whether the step is in front of the middleware.
func (s Step) Outer() bool { return strings.HasPrefix(s.Label, "o") }

// Refuses reports whether a guard refuses in the given run of the chain:
// the application's decision may change between runs (stock ran out, a
// limit was reached), as it may between a request and its retry.
func (s Step) Refuses(run int) bool { return run >= s.From }

func (s Step) String() string {
	var args []string
	switch s.Kind {
	case GuardWrite, GuardStatus, GuardError:
		args = append(args, fmt.Sprint(s.Status))
		if s.From > 1 {
			args = append(args, fmt.Sprintf("from run %d", s.From))
		}
	}
	if s.Variant != 0 {
		args = append(args, fmt.Sprintf("variant %d", s.Variant))
	}
	if len(args) == 0 {
		return s.Kind.String()
	}
	return s.Kind.String() + "(" + strings.Join(args, ", ") + ")"
}

// Rerun is how Run makes a single-phase request run its chain again.
type Rerun uint8

const (
	// RerunNone runs the chain as traffic would.
	RerunNone Rerun = iota
	// RerunRollback makes the database roll the first run back: another
	// transaction holds the key's record row and waits for a row the first
	// run writes, so the run's record INSERT closes a deadlock (1213), in
	// which the database rolls back the run, the transaction that wrote
	// less. Single-phase then runs the chain again; the row is let go when
	// the second run starts. Used only for chains whose first run commits
	// (2xx, 3xx), the only runs whose transaction inserts the record.
	RerunRollback
	// RerunRenewal stores a record past its retention under the key
	// before the request: the route reads it first and renews the key
	// under a fenced takeover (claim-first), running the chain again when a
	// run answers a non-final status.
	RerunRenewal
	// RerunRenewalAtInsert stores the record past its retention when the
	// first run has ended and before its record INSERT, as when the route
	// does not read the record first (idempotency's replay hint): the run's
	// INSERT (in its transaction, or after it for a rejection) or the
	// look for a winner after a non-final answer meets the record, and the
	// request renews the key and runs the chain again.
	RerunRenewalAtInsert
)

func (r Rerun) String() string {
	return [...]string{"none", "rollback", "renewal", "renewal at the insert"}[r]
}

// Chain is a generated route: Outer in front of the middleware, Inner
// behind it (the protected handlers).
type Chain struct {
	ID    int
	Outer []Step
	Inner []Step
	Rerun Rerun
}

func (c Chain) String() string {
	part := func(steps []Step) string {
		names := make([]string, len(steps))
		for i, s := range steps {
			names[i] = s.String()
		}
		return "[" + strings.Join(names, " → ") + "]"
	}
	return fmt.Sprintf("chain %d: front %s, protected %s, rerun %s", c.ID, part(c.Outer), part(c.Inner), c.Rerun)
}

// Rules say which chains a front-end can serve.
type Rules struct {
	Outer    []Kind       // kinds allowed in front of the middleware
	Inner    []Kind       // kinds allowed behind it
	MaxOuter int          // at most this many steps in front (0..MaxOuter)
	MaxInner int          // at most this many behind (1..MaxInner)
	Variants map[Kind]int // idioms per kind (1 when absent)
	// Reruns: the mode runs a chain again within a request (single-phase),
	// so chains come with RerunRollback and RerunRenewal too.
	Reruns bool
}

// refusalStatuses are what guards refuse with: final (403, 422) and
// non-final (400, 503) under idempotency.DefaultIsFinal, so that refusals
// are stored, released, and, in a renewal, run again.
var refusalStatuses = []int{http.StatusBadRequest, http.StatusForbidden, http.StatusUnprocessableEntity, http.StatusServiceUnavailable}

// Generate returns n chains drawn from seed: the same seed and rules give
// the same chains.
func Generate(seed int64, n int, r Rules) []Chain {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x636861696e))
	chains := make([]Chain, n)
	for i := range chains {
		chains[i] = generate(rng, i, r)
	}
	return chains
}

func generate(rng *rand.Rand, id int, r Rules) Chain {
	ch := Chain{ID: id}
	for i := range rng.IntN(r.MaxOuter + 1) {
		ch.Outer = append(ch.Outer, step(rng, r, r.Outer, fmt.Sprintf("o%d", i)))
	}
	n := 1 + rng.IntN(r.MaxInner)
	for i := range n {
		ch.Inner = append(ch.Inner, step(rng, r, r.Inner, fmt.Sprintf("i%d", i)))
	}
	// Most chains end in the create handler, so that what a refusal
	// prevents is an order.
	if last := &ch.Inner[n-1]; last.Kind != Create && slices.Contains(r.Inner, Create) && rng.IntN(10) < 7 {
		*last = Step{Label: last.Label, Kind: Create, Variant: rng.IntN(variants(r, Create))}
	}
	if r.Reruns {
		switch p := rng.IntN(100); {
		case p < 20:
			ch.Rerun = RerunRollback
		case p < 30:
			ch.Rerun = RerunRenewal
		case p < 40:
			ch.Rerun = RerunRenewalAtInsert
		}
	}
	return ch
}

func step(rng *rand.Rand, r Rules, kinds []Kind, label string) Step {
	s := Step{Label: label, Kind: kinds[rng.IntN(len(kinds))]}
	if !s.Outer() { // in front of the middleware a step keeps its first idiom: a header, not a body, before it
		s.Variant = rng.IntN(variants(r, s.Kind))
	}
	switch s.Kind {
	case GuardWrite, GuardStatus, GuardError:
		s.Status = refusalStatuses[rng.IntN(len(refusalStatuses))]
		s.From = 1
		if !s.Outer() && r.Reruns && rng.IntN(10) < 4 {
			s.From = 2 // a decision that changes on the run after the first
		}
	}
	return s
}

func variants(r Rules, k Kind) int {
	if n := r.Variants[k]; n > 0 {
		return n
	}
	return 1
}
