package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/orderguard/idempotency"
)

// Middleware returns m as echo middleware. The handler it wraps is the
// protected handler: it runs inside m, finds the transaction through
// c.Request().Context(), and its response and returned error are recorded
// (see the package documentation).
func Middleware(m *idempotency.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req, res := c.Request(), c.Response()
			m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Restored even after a panic: m answers through res.
				defer func() { c.SetRequest(req); c.SetResponse(res) }()
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo())) // w: the recorder, or res for a keyless request (KeyOptional)
				if err := next(c); err != nil {
					c.Error(err) // into the recording: the error's answer is the answer
				}
			})).ServeHTTP(res, req)
			return nil
		}
	}
}
