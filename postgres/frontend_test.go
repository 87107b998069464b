package postgres_test

import (
	"net/http/httptest"
	"testing"

	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// net/http's Handler passes the front-end conformance suite on PostgreSQL.
func TestFrontend_NetHTTP(t *testing.T) {
	t.Parallel()
	frontendtest.Exercise(t, pgtest.Database, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
		srv := httptest.NewServer(env.Service)
		t.Cleanup(srv.Close)
		return frontendtest.HTTP(srv.URL)
	})
}
