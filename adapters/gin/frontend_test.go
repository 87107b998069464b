package idemgin_test

import (
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// gin, through Wrap and through Middleware, passes the front-end
// conformance suite on MariaDB and PostgreSQL: the example's create served
// by gin handlers the way a gin application writes them.
func TestFrontend_Gin(t *testing.T) {
	t.Parallel()
	for _, ctor := range constructors {
		// Middleware runs gin's chain once: it refuses single-phase.
		modes := []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase}
		if ctor.name == chain.name {
			modes = modes[:1]
		}
		t.Run(ctor.name, func(t *testing.T) {
			t.Parallel()
			for _, db := range []frontendtest.Database{frontendtest.MySQL, pgtest.Database} {
				frontendtest.Exercise(t, db, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
					r := gin.New()
					handlers := append([]gin.HandlerFunc{authenticate, checkCreate},
						ctor.route(env.Service.Middleware("create_order"), create(env.Service))...)
					r.POST("/orders", handlers...)
					srv := httptest.NewServer(r)
					t.Cleanup(srv.Close)
					return frontendtest.HTTP(srv.URL)
				}, modes...)
			}
		})
	}
}

func authenticate(c *gin.Context) {
	if _, p := orderservice.Principal(c.Request); p != nil {
		idempotency.WriteProblem(c.Writer, p)
		c.Abort()
	}
}

func checkCreate(c *gin.Context) {
	if p := orderservice.CheckCreate(c.Writer, c.Request); p != nil {
		idempotency.WriteProblem(c.Writer, p)
		c.Abort()
	}
}

func create(svc *orderservice.Service) gin.HandlerFunc {
	return func(c *gin.Context) {
		reply := svc.CreateFromHTTP(c.Request)
		if reply.Problem != nil {
			c.Header("Content-Type", "application/problem+json")
		}
		for k, v := range reply.Header {
			c.Header(k, v[0])
		}
		ct, body := reply.Body()
		c.Data(reply.StatusCode(), ct, body)
	}
}
