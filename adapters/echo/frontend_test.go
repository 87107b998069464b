package idemecho_test

import (
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/orderguard/idempotency"
	idemecho "github.com/orderguard/idempotency/adapters/echo"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// echo passes the front-end conformance suite on MariaDB and PostgreSQL:
// the example's create served by echo handlers the way an echo application
// writes them.
func TestFrontend_Echo(t *testing.T) {
	t.Parallel()
	for _, db := range []frontendtest.Database{frontendtest.MySQL, pgtest.Database} {
		frontendtest.Exercise(t, db, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
			e := echo.New()
			e.POST("/orders", create(env.Service), authenticate, checkCreate, idemecho.Middleware(env.Service.Middleware("create_order")))
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			return frontendtest.HTTP(srv.URL)
		})
	}
}

func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if _, p := orderservice.Principal(c.Request()); p != nil {
			idempotency.WriteProblem(c.Response(), p)
			return nil
		}
		return next(c)
	}
}

func checkCreate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := orderservice.CheckCreate(c.Response(), c.Request()); p != nil {
			idempotency.WriteProblem(c.Response(), p)
			return nil
		}
		return next(c)
	}
}

func create(svc *orderservice.Service) echo.HandlerFunc {
	return func(c echo.Context) error {
		reply := svc.CreateFromHTTP(c.Request())
		for k, v := range reply.Header {
			c.Response().Header().Set(k, v[0])
		}
		ct, body := reply.Body()
		return c.Blob(reply.StatusCode(), ct, body)
	}
}
