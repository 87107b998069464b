package idemgrpc_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	_ "google.golang.org/grpc/health/grpc_health_v1" // registers the Health service's types

	"github.com/orderguard/idempotency"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// A Middleware that declares its Operation declares the action for gRPC
// too: a method that redeclares its route or fields is refused when the
// interceptor is built, not found out by a client's KEY_REUSED.
func TestNewServerInterceptor_MiddlewareWithOperation_RefusesARedeclaration(t *testing.T) {
	t.Parallel()
	const method = "/grpc.health.v1.Health/Check"
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), &idempotency.Config{
		Operation: &idempotency.Operation{Name: "check", Route: "POST /health/{service}"},
	})
	require.NoError(t, err)

	_, err = idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{method: {Middleware: mw}})
	require.NoError(t, err)
	for _, m := range []idemgrpc.Method{
		{Middleware: mw, Route: "POST /health"},
		{Middleware: mw, Fingerprint: idempotency.FingerprintConfig{Fields: []string{"service"}}},
	} {
		_, err := idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{method: m})
		require.ErrorContains(t, err, "declares the action")
	}
}
