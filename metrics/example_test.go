package metrics_test

import (
	"database/sql"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/metrics"
)

// One Observer per registry serves every route's Middleware, the
// Reconciler and Purge.
func ExampleNew() {
	var db *sql.DB                           // the service's MySQL/MariaDB handle
	var createOrder http.Handler             // the handler to protect
	var recoverOrder idempotency.RecoverFunc // finds an abandoned attempt's order

	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.WithRoutes("create_order"))
	if err != nil {
		log.Fatal(err)
	}
	store := idempotency.NewMySQLStore(db)
	mw, err := idempotency.New(store, &idempotency.Config{Route: "create_order", Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	reconciler := &idempotency.Reconciler{Store: store, Recover: recoverOrder, Observer: obs}
	_ = reconciler // go reconciler.Run(ctx)

	http.Handle("POST /orders", mw.Handler(createOrder))
	http.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
