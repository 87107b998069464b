package idemgin_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/orderguard/idempotency"
	idemgin "github.com/orderguard/idempotency/adapters/gin"
	"github.com/orderguard/idempotency/internal/chaintest"
)

// The differential test: generated chains served by gin alone and behind
// the middleware must answer, write and call the same, or give an answer
// the package documents (see chaintest). CHAINTEST_SEED and CHAINTEST_CHAINS
// draw a failing run again.

func TestDifferential_Wrap_BehavesLikeGin(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			chaintest.Run(t, ginFront("Wrap", false), chaintest.Options{Mode: mode})
		})
	}
}

func TestDifferential_Middleware_BehavesLikeGin(t *testing.T) {
	t.Parallel()
	chaintest.Run(t, ginFront("Middleware", true), chaintest.Options{Mode: idempotency.ModeClaimFirst})
}

func modeName(m idempotency.Mode) string {
	if m == idempotency.ModeSinglePhase {
		return "single-phase"
	}
	return "claim-first"
}

// ginFront serves chains with the protected steps given to Wrap or
// registered after Middleware (chain true: they may call c.Next()).
func ginFront(name string, chain bool) chaintest.Front {
	front := []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.WriteBefore, chaintest.GuardWrite, chaintest.GuardStatus}
	inner := []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.GuardWrite, chaintest.GuardStatus,
		chaintest.GuardError, chaintest.Panic, chaintest.WriteBefore, chaintest.Create}
	if chain { // handlers that call c.Next() belong in front of Wrap
		inner = append(inner, chaintest.WriteAfter, chaintest.Recover)
	}
	return chaintest.Front{
		Name: "gin " + name,
		Rules: chaintest.Rules{
			Outer: front, Inner: inner, MaxOuter: 2, MaxInner: 5, Reruns: !chain,
			Variants: map[chaintest.Kind]int{chaintest.GuardWrite: 2, chaintest.WriteBefore: 2, chaintest.Create: 3},
		},
		Plain: func(ch chaintest.Chain) http.Handler {
			return ginRoute(ch, ginSteps(ch.Inner, chain))
		},
		Protected: func(ch chaintest.Chain, mw *idempotency.Middleware) http.Handler {
			if chain {
				return ginRoute(ch, append([]gin.HandlerFunc{idemgin.Middleware(mw)}, ginSteps(ch.Inner, true)...))
			}
			return ginRoute(ch, []gin.HandlerFunc{idemgin.Wrap(mw, ginSteps(ch.Inner, false)...)})
		},
		RefusesReruns: true,
		Divergences:   []chaintest.Divergence{errorsLeftToRenderer},
	}
}

// errorsLeftToRenderer: protected handlers that add to c.Errors and write
// nothing leave the answer to the renderer in front, which would write it
// after the commit, unrecorded; they are answered 500 and rolled back
// instead (see the package documentation).
var errorsLeftToRenderer = chaintest.Divergence{
	Name: "errors left to the renderer in front answered 500",
	Applies: func(got, want chaintest.Result) bool {
		var rendered struct{ Errors []string }
		return got.Status == http.StatusInternalServerError && len(got.Body) == 0 &&
			json.Unmarshal(want.Body, &rendered) == nil && len(rendered.Errors) > 0 &&
			slices.Equal(got.Trace, want.Trace)
	},
}

// ginRoute is a gin engine as its users have it, a recovery and an error
// renderer in front, then the chain's front steps and the route.
func ginRoute(ch chaintest.Chain, route []gin.HandlerFunc) http.Handler {
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard), renderChainErrors)
	r.Use(ginSteps(ch.Outer, true)...)
	r.POST("/orders", route...)
	return r
}

// renderChainErrors renders c.Errors when nothing was written, with the
// status a refusal carries.
func renderChainErrors(c *gin.Context) {
	c.Next()
	if len(c.Errors) == 0 || c.Writer.Written() {
		return
	}
	status := http.StatusInternalServerError
	var refusal *chaintest.RefusalError
	if errors.As(c.Errors.Last(), &refusal) {
		status = refusal.Status
	}
	c.JSON(status, gin.H{"errors": c.Errors.Errors()})
}

// ginSteps writes steps as gin handlers; next says whether they may call
// c.Next(). Each reports a run that ended aborted (for RerunRefused).
func ginSteps(steps []chaintest.Step, next bool) []gin.HandlerFunc {
	var handlers []gin.HandlerFunc
	for _, s := range steps {
		for _, h := range ginStep(s, next) {
			handlers = append(handlers, func(c *gin.Context) {
				h(c)
				if c.IsAborted() {
					chaintest.From(c.Request.Context()).Aborted()
				}
			})
		}
	}
	return handlers
}

func ginStep(s chaintest.Step, next bool) []gin.HandlerFunc {
	rest := func(c *gin.Context) {
		if next {
			c.Next()
		}
	}
	if s.Kind == chaintest.Recover {
		return []gin.HandlerFunc{
			gin.RecoveryWithWriter(io.Discard),
			func(c *gin.Context) {
				ex := chaintest.From(c.Request.Context())
				ex.Note(s, "recover")
				defer func() {
					if v := recover(); v != nil {
						ex.Note(s, "recovered")
						panic(v)
					}
				}()
				c.Next()
			},
		}
	}
	return []gin.HandlerFunc{func(c *gin.Context) {
		ex := chaintest.From(c.Request.Context())
		switch s.Kind {
		case chaintest.Pass:
			ex.Note(s, "pass")
			rest(c)
		case chaintest.Return:
			ex.Note(s, "return")
		case chaintest.GuardWrite, chaintest.GuardStatus, chaintest.GuardError:
			if !ex.Refuses(s) {
				ex.Note(s, "allow")
				rest(c)
				return
			}
			ex.Note(s, "refuse")
			switch {
			case s.Kind == chaintest.GuardWrite && s.Variant == 0:
				c.AbortWithStatusJSON(s.Status, ex.Refusal(s))
			case s.Kind == chaintest.GuardWrite:
				c.AbortWithStatus(s.Status)
			case s.Kind == chaintest.GuardStatus:
				c.Status(s.Status)
				c.Abort()
			default:
				_ = c.Error(ex.Error(s))
				c.Abort()
			}
		case chaintest.Panic:
			ex.Note(s, "panic")
			panic("chain step " + s.Label)
		case chaintest.WriteBefore:
			ex.Note(s, "before")
			c.Writer.Header().Add(ex.Header(s), s.Label+"-before")
			if s.Variant == 1 {
				_, _ = c.Writer.WriteString(ex.Fragment(s, "before"))
			}
			rest(c)
		case chaintest.WriteAfter:
			rest(c)
			ex.Note(s, "after")
			c.Writer.Header().Add(ex.Header(s), s.Label+"-after")
			_, _ = c.Writer.WriteString(ex.Fragment(s, "after"))
		case chaintest.Create:
			ex.Note(s, "create")
			if err := ex.CreateOrder(c.Request.Context(), s); err != nil {
				c.AbortWithStatusJSON(http.StatusTeapot, gin.H{"error": err.Error()})
				return
			}
			c.Header("Location", ex.Location(s))
			switch s.Variant {
			case 0:
				c.JSON(http.StatusCreated, ex.Created(s))
			case 1:
				c.AbortWithStatusJSON(http.StatusCreated, ex.Created(s))
			default:
				c.Status(http.StatusCreated)
			}
		default:
			panic("ginStep: no idiom for " + s.Kind.String())
		}
	}}
}
