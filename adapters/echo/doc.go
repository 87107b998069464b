// Package idemecho runs an idempotency.Middleware as echo middleware.
//
// Register it on the route it protects:
//
//	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{...})
//	e.POST("/orders", createOrder, idemecho.Middleware(mw))
//
// and do the business writes in the request's transaction:
//
//	func createOrder(c echo.Context) error {
//		tx, _ := idempotency.TxFromContext(c.Request().Context())
//		... write the order with tx; do not commit ...
//		return c.JSON(http.StatusCreated, order)
//	}
//
// The handler (and the middleware registered inside this one) runs at most
// once per key and fingerprint. While it runs, c.Request() carries the
// transaction and c.Response() is an echo.Response over the middleware's
// recorder; afterwards both are the ones the middleware was given again, and
// the answer reaches the client once, after the commit, through that
// response, so middleware in front of it (a logger) sees the final status
// and size. A replay, a conflict or a bad key is answered without calling the
// handler.
//
// # Errors the handler returns
//
// An error the handler returns is answered inside the recording, by
// e.HTTPErrorHandler (c.Error), so it is the recorded answer like any other:
// an echo.NewHTTPError(422, ...) is a final 4xx, stored and replayed; a
// plain error is echo's 500, which rolls the transaction back and releases
// the key. The middleware then returns nil, as echo's own Logger does once it
// has called c.Error: the error has been answered, and the client's answer,
// in c.Response(), may even be another request's (a single-phase duplicate
// replays the winner). Log handler errors inside the chain.
//
// # Running the handler again
//
// In ModeSinglePhase the middleware may run the handler more than once in
// one request: after the database rolled a run back (up to three runs), or
// to renew a key past its retention. echo has no abort state to carry over:
// each run calls next(c) again, with a new echo.Response over that run's
// recording and the request of that run, so it stops, answers and fails as
// a first run does. Values a discarded run stored with c.Set stay.
//
// A differential test (differential_test.go) runs thousands of generated
// chains of guards, returned errors, panics (with echo's Recover in front or
// among the protected middleware), writes before and after next(c), early
// returns and the create handler through the middleware (both modes, with
// forced re-runs) and through echo alone, and requires the same status,
// body, headers, committed orders and handler calls. The one documented
// difference: a panic that no Recover behind the middleware catches is
// answered 500 execution-failed by the middleware, rolled back, not by the
// Recover in front.
//
// # Why not echo.WrapMiddleware(m.Handler)
//
// WrapMiddleware gives the handler the recorder and the request with the
// transaction, but it returns the handler's error to echo, which answers it
// after the middleware has finished: the recorder saw nothing, so the
// middleware committed the handler's writes with an empty 200 as the stored
// answer, and every retry replays that 200. It also leaves c.Response() on
// the recorder and c.Request() on the finished transaction, so middleware in
// front of it reads the recorded status (0 after a panic), not the one sent.
package idemecho
