package tracing_test

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/obstest"
)

// Span names the test service itself records.
const (
	spanServer = "test.http_server"  // as otelhttp would, around the middleware
	spanInsert = "test.insert_order" // the handler's own work, inside the execute stage
)

// newService is the obstest service with obs as the Observer, each request
// inside a server span from tracer and each order insert inside a span of
// its own.
func newService(t *testing.T, obs idempotency.Observer, tracer trace.Tracer) *obstest.Service {
	t.Helper()
	return obstest.NewService(t, obs, obstest.Options{
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx, span := tracer.Start(r.Context(), spanServer, trace.WithSpanKind(trace.SpanKindServer))
				defer span.End()
				next.ServeHTTP(w, r.WithContext(ctx))
			})
		},
		WrapInsert: func(ctx context.Context, insert func(context.Context) error) error {
			ctx, span := tracer.Start(ctx, spanInsert)
			defer span.End()
			return insert(ctx)
		},
	})
}
