package idempotency_test

import (
	"net/http/httptest"
	"testing"

	"github.com/orderguard/idempotency/frontendtest"
)

// net/http's Handler passes the front-end conformance suite on MariaDB
// (package postgres runs it on PostgreSQL).
func TestFrontend_NetHTTP(t *testing.T) {
	t.Parallel()
	frontendtest.Exercise(t, frontendtest.MySQL, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
		srv := httptest.NewServer(env.Service)
		t.Cleanup(srv.Close)
		return frontendtest.HTTP(srv.URL)
	})
}
