package chaintest_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/chaintest"
)

var netHTTPRules = chaintest.Rules{
	Outer: []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.WriteBefore, chaintest.GuardWrite, chaintest.GuardStatus},
	Inner: []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.GuardWrite, chaintest.GuardStatus,
		chaintest.Panic, chaintest.WriteBefore, chaintest.WriteAfter, chaintest.Recover, chaintest.Create},
	MaxOuter: 2, MaxInner: 5, Reruns: true,
	Variants: map[chaintest.Kind]int{chaintest.WriteBefore: 2, chaintest.Create: 2},
}

func TestGenerate_TheSameSeedDrawsTheSameChains(t *testing.T) {
	t.Parallel()
	require.Equal(t, chaintest.Generate(7, 200, netHTTPRules), chaintest.Generate(7, 200, netHTTPRules))
	require.NotEqual(t, chaintest.Generate(7, 200, netHTTPRules), chaintest.Generate(8, 200, netHTTPRules))
}

func TestGenerate_KeepsTheRules(t *testing.T) {
	t.Parallel()
	rules := netHTTPRules
	rules.Inner = []chaintest.Kind{chaintest.GuardStatus, chaintest.Create}
	seen := map[chaintest.Rerun]int{}
	for _, ch := range chaintest.Generate(1, 2000, rules) {
		require.LessOrEqual(t, len(ch.Outer), rules.MaxOuter, "%v", ch)
		require.NotEmpty(t, ch.Inner, "%v", ch)
		require.LessOrEqual(t, len(ch.Inner), rules.MaxInner, "%v", ch)
		for i, s := range ch.Outer {
			require.Equal(t, fmt.Sprintf("o%d", i), s.Label)
			require.Contains(t, rules.Outer, s.Kind, "%v", ch)
			require.Zero(t, s.Variant, "a step in front keeps its first idiom: %v", ch)
			if s.Kind == chaintest.GuardStatus || s.Kind == chaintest.GuardWrite {
				require.Equal(t, 1, s.From, "a step in front runs once, before the first run: %v", ch)
			}
		}
		for i, s := range ch.Inner {
			require.Equal(t, fmt.Sprintf("i%d", i), s.Label)
			require.Contains(t, rules.Inner, s.Kind, "%v", ch)
			require.Less(t, s.Variant, max(1, rules.Variants[s.Kind]), "%v", ch)
			if s.Kind == chaintest.GuardStatus {
				require.Contains(t, []int{1, 2}, s.From, "%v", ch)
				require.GreaterOrEqual(t, s.Status, 400, "%v", ch)
			}
		}
		seen[ch.Rerun]++
	}
	for _, r := range []chaintest.Rerun{chaintest.RerunNone, chaintest.RerunRollback, chaintest.RerunRenewal, chaintest.RerunRenewalAtInsert} {
		require.Greater(t, seen[r], 100, "chains with rerun %s", r)
	}
	rules.Reruns = false
	for _, ch := range chaintest.Generate(1, 500, rules) {
		require.Equal(t, chaintest.RerunNone, ch.Rerun, "a mode that never runs again: %v", ch)
		for _, s := range ch.Inner {
			require.LessOrEqual(t, s.From, 1, "no decision changes between runs that never happen: %v", ch)
		}
	}
}

// net/http is the front-end of the middleware itself (mw.Handler): the
// differential test holds for it with no documented answer but the panic's.
func TestRun_NetHTTP_BehavesLikeNetHTTP(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]idempotency.Mode{"claim-first": idempotency.ModeClaimFirst, "single-phase": idempotency.ModeSinglePhase} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			chaintest.Run(t, netHTTPFront(false), chaintest.Options{Mode: mode, Chains: 1000})
		})
	}
}

// The test is not vacuous: a front-end that, like idemgin.Wrap before the
// fix, walks past a guard's refusal when the chain runs again commits what
// the framework refuses, and the run fails, naming the chain and the seed.
func TestRun_AFrontThatWalksPastARefusalOnARunAgain_Fails(t *testing.T) {
	t.Parallel()
	rec := &recordingTB{TB: t}
	report := chaintest.Run(rec, netHTTPFront(true), chaintest.Options{Mode: idempotency.ModeSinglePhase, Chains: 400, Seed: 1})
	require.NotEmpty(t, rec.errors, "the run found nothing wrong: %v", report)
	require.Contains(t, rec.errors[0], "the protected chain differs from the framework alone")
	require.Contains(t, rec.errors[0], "CHAINTEST_SEED=1")
	require.Contains(t, rec.errors[0], "shrunk to")
}

// recordingTB keeps the failures it is told of instead of failing.
type recordingTB struct {
	testing.TB
	errors []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// netHTTPFront serves chains as net/http middleware. walkPastGuards makes
// it wrong: on a run after the first, a refusing guard is walked past.
func netHTTPFront(walkPastGuards bool) chaintest.Front {
	name := "net/http"
	if walkPastGuards {
		name = "net/http walking past guards on a run again"
	}
	return chaintest.Front{
		Name:  name,
		Rules: netHTTPRules,
		Plain: func(ch chaintest.Chain) http.Handler {
			return recoverFront(netHTTPChain(ch.Outer, netHTTPChain(ch.Inner, nothing, false), false))
		},
		Protected: func(ch chaintest.Chain, mw *idempotency.Middleware) http.Handler {
			return recoverFront(netHTTPChain(ch.Outer, mw.Handler(netHTTPChain(ch.Inner, nothing, walkPastGuards)), false))
		},
	}
}

// nothing ends a chain whose steps all call the rest.
var nothing = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// recoverFront is the recovery a net/http user has in front: a panic is a
// 500.
func recoverFront(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// netHTTPChain puts steps in front of end.
func netHTTPChain(steps []chaintest.Step, end http.Handler, walkPastGuards bool) http.Handler {
	h := end
	for i := len(steps) - 1; i >= 0; i-- {
		h = netHTTPStep(steps[i], h, walkPastGuards)
	}
	return h
}

func netHTTPStep(s chaintest.Step, next http.Handler, walkPastGuards bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex := chaintest.From(r.Context())
		switch s.Kind {
		case chaintest.Pass:
			ex.Note(s, "pass")
			next.ServeHTTP(w, r)
		case chaintest.Return:
			ex.Note(s, "return")
		case chaintest.GuardWrite, chaintest.GuardStatus:
			if !ex.Refuses(s) || (walkPastGuards && ex.Run() > 1) {
				ex.Note(s, "allow")
				next.ServeHTTP(w, r)
				return
			}
			ex.Note(s, "refuse")
			if s.Kind == chaintest.GuardWrite {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(s.Status)
				fmt.Fprintf(w, `{"refused":%q}`, s.Label)
				return
			}
			w.WriteHeader(s.Status)
		case chaintest.Panic:
			ex.Note(s, "panic")
			panic("chain step " + s.Label)
		case chaintest.WriteBefore:
			ex.Note(s, "before")
			w.Header().Add(ex.Header(s), s.Label+"-before")
			if s.Variant == 1 {
				_, _ = w.Write([]byte(ex.Fragment(s, "before")))
			}
			next.ServeHTTP(w, r)
		case chaintest.WriteAfter:
			next.ServeHTTP(w, r)
			ex.Note(s, "after")
			w.Header().Add(ex.Header(s), s.Label+"-after")
			_, _ = w.Write([]byte(ex.Fragment(s, "after")))
		case chaintest.Recover:
			ex.Note(s, "recover")
			defer func() {
				if v := recover(); v != nil {
					ex.Note(s, "recovered")
					w.WriteHeader(http.StatusInternalServerError)
				}
			}()
			next.ServeHTTP(w, r)
		case chaintest.Create:
			ex.Note(s, "create")
			if err := ex.CreateOrder(r.Context(), s); err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			w.Header().Set("Location", ex.Location(s))
			if s.Variant == 1 {
				w.WriteHeader(http.StatusCreated)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"created":%q}`, s.Label)
		default:
			panic("netHTTPStep: no idiom for " + s.Kind.String())
		}
	})
}
