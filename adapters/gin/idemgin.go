package idemgin

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"

	"github.com/orderguard/idempotency"
)

// Wrap returns handlers, protected by m, as one gin handler: the
// recommended form, for either mode.
//
//	r.POST("/orders", idemgin.Wrap(mw, createOrder))
//
// Each run m makes calls the handlers in order on the same *gin.Context,
// stopping after one that aborted, as gin does; c.Request carries the
// transaction and c.Writer records the answer. A single-phase route may run
// them more than once in one request (see the package documentation): each
// run starts again from the first handler with the c.Errors of the run
// before dropped, unless a run before it aborted: gin cannot undo an abort,
// so such a run is refused, rolled back and answered 503 rerun-refused (see
// idempotency.ErrRerunRefused). Handlers given to Wrap must not call
// c.Next(): gin would go on with the route's handlers after Wrap, not with
// the next handler given here. Wrap panics without m or handlers.
func Wrap(m *idempotency.Middleware, handlers ...gin.HandlerFunc) gin.HandlerFunc {
	if m == nil {
		panic("idemgin: Wrap needs an *idempotency.Middleware")
	}
	if len(handlers) == 0 {
		panic("idemgin: Wrap needs the handlers it protects")
	}
	handlers = slices.Clone(handlers)
	return func(c *gin.Context) {
		serve(m, c, func() {
			if c.IsAborted() {
				panic(errAbortedBefore)
			}
			callInOrder(c, handlers)
		})
	}
}

// errAbortedBefore refuses a run that starts with the chain aborted: a run
// after a run that aborted. gin keeps an abort in an unexported index that
// nothing can reset, and while it is set an abort is invisible, so such a
// run cannot stop where gin would: a guard's c.Status(400); c.Abort() would
// be walked past and the handlers after it would commit an order the guard
// refused. Nothing can tell what the run would have decided, so it fails
// closed: rolled back, key released, 503 with Retry-After. The retry is a
// new request, a first run.
var errAbortedBefore = fmt.Errorf("%w: idemgin: a run of Wrap's handlers after a run that aborted (gin cannot undo an abort)", idempotency.ErrRerunRefused)

// Middleware returns m as gin middleware for a claim-first route: the
// handlers registered after it are the protected handler, run once by
// c.Next().
//
//	r.POST("/orders", idemgin.Middleware(mw), createOrder)
//
// gin can run its chain only once per request, so Middleware panics if m is
// single-phase (its handler may run again): use Wrap there.
func Middleware(m *idempotency.Middleware) gin.HandlerFunc {
	if m == nil {
		panic("idemgin: Middleware needs an *idempotency.Middleware")
	}
	if m.Mode() == idempotency.ModeSinglePhase {
		panic("idemgin: Middleware runs gin's chain once; a single-phase route may run its handler again: use idemgin.Wrap")
	}
	return func(c *gin.Context) {
		ran := false
		serve(m, c, func() {
			if ran {
				panic(errRunAgain)
			}
			ran = true
			c.Next()
		})
	}
}

// errRunAgain is the panic of a second run of the chain, which claim-first
// never asks for: a second c.Next() would run nothing and commit an empty
// 200, where the panic is rolled back, the key released and the client
// answered 503 rerun-refused.
var errRunAgain = fmt.Errorf("%w: idemgin: Middleware cannot run gin's chain a second time; use idemgin.Wrap", idempotency.ErrRerunRefused)

// serve runs m in front of handle, the protected handlers, which m may call
// once per run. Each run sees the request that carries the transaction and a
// gin writer over m's recorder, and starts with the c.Errors the route had
// when it reached m. c's writer and request are restored after each run,
// even after a panic: m answers through the writer it was given. When m
// answered by itself, or the last run panicked, the route is aborted.
func serve(m *idempotency.Middleware, c *gin.Context, handle func()) {
	errs := len(c.Errors)
	finished := false // the last run returned
	m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		finished = false
		c.Errors = c.Errors[:errs] // a discarded run's errors are not this answer's
		writer, request := c.Writer, c.Request
		defer func() { c.Writer, c.Request = writer, request }()
		var rw *responseWriter
		if _, _, recorded := idempotency.KeyFromContext(r.Context()); recorded {
			rw = newResponseWriter(w)
			c.Writer = rw
		} // else a keyless request passed through unprotected (KeyOptional): w is c.Writer
		c.Request = r
		handle()
		if rw != nil {
			if !rw.Written() && len(c.Errors) > errs {
				// Errors and no answer written (a bodiless c.Status(201)
				// is not written yet either): the handlers left the answer
				// to an error renderer in front of m, which would write it
				// after the commit, unrecorded, over a committed empty
				// answer. Answer 500 instead: rolled back, key released.
				c.AbortWithStatus(http.StatusInternalServerError)
			}
			rw.WriteHeaderNow() // as gin's engine does after a chain, for a bodiless c.Status(201)
		}
		finished = true
	})).ServeHTTP(c.Writer, c.Request)
	if !finished {
		c.Abort()
	}
}

// callInOrder calls handlers as gin's chain would: in order, stopping after
// one that aborted. c must not be aborted yet (see errAbortedBefore).
func callInOrder(c *gin.Context, handlers []gin.HandlerFunc) {
	for _, h := range handlers {
		h(c)
		if c.IsAborted() {
			return
		}
	}
}
