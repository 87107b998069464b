package idemecho_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/orderguard/idempotency"
	idemecho "github.com/orderguard/idempotency/adapters/echo"
	"github.com/orderguard/idempotency/internal/chaintest"
)

// The differential test: generated chains served by echo alone and behind
// the middleware must answer, write and call the same, or give an answer
// the package documents (see chaintest). CHAINTEST_SEED and CHAINTEST_CHAINS
// draw a failing run again.
func TestDifferential_Middleware_BehavesLikeEcho(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]idempotency.Mode{"claim-first": idempotency.ModeClaimFirst, "single-phase": idempotency.ModeSinglePhase} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			chaintest.Run(t, echoFront, chaintest.Options{Mode: mode})
		})
	}
}

var echoFront = chaintest.Front{
	Name: "echo Middleware",
	Rules: chaintest.Rules{
		Outer: []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.WriteBefore, chaintest.GuardWrite, chaintest.GuardStatus},
		Inner: []chaintest.Kind{chaintest.Pass, chaintest.Return, chaintest.GuardWrite, chaintest.GuardStatus, chaintest.GuardError,
			chaintest.Panic, chaintest.WriteBefore, chaintest.WriteAfter, chaintest.Recover, chaintest.Create},
		MaxOuter: 2, MaxInner: 5, Reruns: true,
		Variants: map[chaintest.Kind]int{chaintest.GuardWrite: 2, chaintest.WriteBefore: 2, chaintest.Create: 3},
	},
	Plain: func(ch chaintest.Chain) http.Handler {
		return echoRoute(ch, echoSteps(ch.Inner))
	},
	Protected: func(ch chaintest.Chain, mw *idempotency.Middleware) http.Handler {
		return echoRoute(ch, append([]echo.MiddlewareFunc{idemecho.Middleware(mw)}, echoSteps(ch.Inner)...))
	},
}

// echoRoute is an echo server as its users have it, its recovery in front,
// then the chain's front steps and the route's middleware in front of a
// handler that does nothing.
func echoRoute(ch chaintest.Chain, route []echo.MiddlewareFunc) http.Handler {
	e := echo.New()
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.Recover())
	e.Use(echoSteps(ch.Outer)...)
	e.POST("/orders", func(echo.Context) error { return nil }, route...)
	return e
}

func echoSteps(steps []chaintest.Step) []echo.MiddlewareFunc {
	mws := make([]echo.MiddlewareFunc, len(steps))
	for i, s := range steps {
		mws[i] = echoStep(s)
	}
	return mws
}

func echoStep(s chaintest.Step) echo.MiddlewareFunc {
	if s.Kind == chaintest.Recover {
		recoverMW := middleware.Recover()
		return func(next echo.HandlerFunc) echo.HandlerFunc {
			h := recoverMW(func(c echo.Context) error {
				ex := chaintest.From(c.Request().Context())
				defer func() {
					if v := recover(); v != nil {
						ex.Note(s, "recovered")
						panic(v)
					}
				}()
				return next(c)
			})
			return func(c echo.Context) error {
				chaintest.From(c.Request().Context()).Note(s, "recover")
				return h(c)
			}
		}
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ex := chaintest.From(c.Request().Context())
			switch s.Kind {
			case chaintest.Pass:
				ex.Note(s, "pass")
				return next(c)
			case chaintest.Return:
				ex.Note(s, "return")
				return nil
			case chaintest.GuardWrite, chaintest.GuardStatus, chaintest.GuardError:
				if !ex.Refuses(s) {
					ex.Note(s, "allow")
					return next(c)
				}
				ex.Note(s, "refuse")
				switch {
				case s.Kind == chaintest.GuardWrite && s.Variant == 0:
					return c.JSON(s.Status, ex.Refusal(s))
				case s.Kind == chaintest.GuardWrite:
					return c.String(s.Status, "refused by "+s.Label)
				case s.Kind == chaintest.GuardStatus:
					return c.NoContent(s.Status)
				default:
					return echo.NewHTTPError(s.Status, ex.Error(s).Error())
				}
			case chaintest.Panic:
				ex.Note(s, "panic")
				panic("chain step " + s.Label)
			case chaintest.WriteBefore:
				ex.Note(s, "before")
				c.Response().Header().Add(ex.Header(s), s.Label+"-before")
				if s.Variant == 1 {
					if _, err := c.Response().Write([]byte(ex.Fragment(s, "before"))); err != nil {
						return err
					}
				}
				return next(c)
			case chaintest.WriteAfter:
				err := next(c)
				ex.Note(s, "after")
				c.Response().Header().Add(ex.Header(s), s.Label+"-after")
				if _, werr := c.Response().Write([]byte(ex.Fragment(s, "after"))); werr != nil && err == nil {
					err = werr
				}
				return err
			case chaintest.Create:
				ex.Note(s, "create")
				if err := ex.CreateOrder(c.Request().Context(), s); err != nil {
					return c.JSON(http.StatusTeapot, map[string]string{"error": err.Error()})
				}
				c.Response().Header().Set("Location", ex.Location(s))
				switch s.Variant {
				case 0:
					return c.JSON(http.StatusCreated, ex.Created(s))
				case 1:
					if err := c.JSON(http.StatusCreated, ex.Created(s)); err != nil {
						return err
					}
					return next(c)
				default:
					return c.NoContent(http.StatusCreated)
				}
			}
			panic("echoStep: no idiom for " + s.Kind.String())
		}
	}
}
