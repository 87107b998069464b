package tracing_test

import (
	"database/sql"
	"log"
	"net/http"

	"go.opentelemetry.io/otel"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/tracing"
)

// The Observer takes its tracer from a TracerProvider, here the global one
// that the service's OpenTelemetry setup installed.
func ExampleNew() {
	var db *sql.DB               // the service's MySQL/MariaDB handle
	var createOrder http.Handler // the handler to protect; its spans nest under idempotency.execute

	obs := tracing.New(otel.GetTracerProvider())
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Route: "create_order", Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	// Wrap it in the HTTP server instrumentation (otelhttp.NewHandler) so
	// that idempotency.request is a child of the server span.
	http.Handle("POST /orders", mw.Handler(createOrder))
}
