// Package idemgin runs an idempotency.Middleware in gin.
//
// Give Wrap the handlers it protects, one Middleware per route; it works in
// either mode:
//
//	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{...})
//	r.POST("/orders", idemgin.Wrap(mw, createOrder))
//
// and do the business writes in the request's transaction:
//
//	func createOrder(c *gin.Context) {
//		tx, _ := idempotency.TxFromContext(c.Request.Context())
//		... write the order with tx; do not commit ...
//		c.JSON(http.StatusCreated, order)
//	}
//
// A claim-first route may also use the chain form, which protects the
// handlers registered after it:
//
//	r.POST("/orders", idemgin.Middleware(mw), createOrder)
//
// Middleware panics on a single-phase route: gin runs its chain once, and a
// single-phase route may run its handler more than once (see below).
//
// The protected handlers run inside the middleware, at most once per key and
// fingerprint: c.Request carries the transaction, and c.Writer records what
// the handlers write (c.JSON, c.AbortWithStatusJSON, c.Writer.Write) by gin's
// own writer rules, so the stored answer is what gin would have sent. The
// answer reaches the client once, after the commit, through the c.Writer the
// middleware was given, so middleware in front of it (a logger) sees the
// final status and size; c.Writer and c.Request are the route's own again.
//
// When the middleware answers by itself (a replay, a 409 conflict or
// in-progress, a 400 for a bad key) or a handler panics (500, rolled back),
// the protected handlers do not run (or stop) and the route is aborted: its
// handlers after the middleware do not run and c.IsAborted() reports true.
// A handler's own abort, c.AbortWithStatusJSON(422, ...), stops the
// handlers after it as gin does, and is an answer like any other: a final
// 4xx is stored and replayed.
//
// Render errors inside the protected handlers, not in front of them:
// whatever is written after the middleware returns is not recorded.
// Handlers that add to c.Errors and write no answer, leaving it to a
// renderer in front, are answered 500 (rolled back, key released) rather
// than committed as an empty 200; so are handlers that set a bodiless
// status (c.Status(201)), which gin writes only after the renderer had its
// turn.
//
// # Running the handlers again
//
// In ModeSinglePhase the middleware may run the handler more than once in
// one request: after the database rolled a run back (up to three runs), or
// to renew a key past its retention. Wrap calls its handlers itself, so each
// run calls them all again from the first, with the c.Errors of the run
// before dropped (c.Keys set by a discarded run stay). Three things follow
// from calling them outside gin's chain:
//
//   - A handler given to Wrap must not call c.Next(): gin would go on with
//     the route's handlers after Wrap, not with the next handler given to
//     Wrap. Register middleware that calls c.Next() (a logger, a recovery,
//     an error renderer) in front of Wrap.
//   - gin offers no way to undo an abort, and while a context is aborted a
//     further abort cannot be seen. A run after a run that aborted (a
//     guard's c.Status(400); c.Abort(), c.Error(err); c.Abort(), any
//     c.AbortWithStatusJSON) cannot stop where gin would: a guard that
//     refuses without writing would be walked past and the handlers after
//     it would commit an order it refused. So Wrap fails closed: such a run
//     calls no handler, is rolled back, the key released, and the client
//     answered 503 rerun-refused with Retry-After
//     (idempotency.ErrRerunRefused), whatever Config.IsFinalFunc says. The
//     retry is a new request, whose first run is gin's. Runs after runs
//     that did not abort are gin's too.
//   - c.IsAborted() stays true after a request any of whose runs aborted.
//
// Middleware cannot run the chain again: gin walks its chain with an
// unexported index, and a second c.Next() would run nothing and commit an
// empty 200. Should a claim-first route ever ask for a second run,
// Middleware refuses it the same way (503 rerun-refused, rolled back, key
// released).
//
// A differential test (differential_test.go) runs thousands of generated
// chains of guards, error renderers, panics, writes before and after
// c.Next(), early returns and the create handler through Wrap (both modes,
// with forced re-runs) and Middleware, and through gin alone, and requires
// the same status, body, headers, committed orders and handler calls, or
// one of the answers documented here: a panic is answered 500
// execution-failed by the middleware, not by the recovery in front; errors
// left to a renderer in front are answered 500; a refused run is 503
// rerun-refused. None of them commits anything.
//
// # Why a dedicated adapter
//
// Running the handlers as the middleware's next handler with a plain
// c.Next() breaks the record:
//
//   - c.Writer must be a gin.ResponseWriter, so the recorder cannot simply
//     take its place; left as it is, the handlers answer the client before
//     the commit, the recorder sees nothing, and an empty 200 is stored and
//     replayed to every retry. The handlers write through a
//     gin.ResponseWriter over the recorder here, and c.Writer is restored
//     before the middleware sends the one answer.
//   - gin's writer holds the status until the body is written, and c.JSON
//     sets Content-Type after the status: a writer that passed the status on
//     at once would have the recorder snapshot the headers without it. The
//     handlers' writer keeps gin's rule and hands the recorder the status
//     with the first byte, or after the handlers for a bodiless
//     c.Status(201).
//   - handlers that panicked or never ran leave gin's chain where it would
//     go on with the next handler; the middleware aborts the route instead.
package idemgin
