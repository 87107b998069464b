package metrics_test

import (
	"database/sql"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/metrics"
	"github.com/orderguard/idempotency/payment"
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

// A PaymentCollector counts every provider's callbacks: hand its Observe to
// each payment.Webhook.
func ExampleNewPaymentCollector() {
	var db *sql.DB                 // the orders' MySQL/MariaDB handle
	var mw *idempotency.Middleware // the payment events' middleware

	reg := prometheus.NewRegistry()
	payments, err := metrics.NewPaymentCollector(reg, metrics.WithProviders("stripe", "alipay"))
	if err != nil {
		log.Fatal(err)
	}
	var verifier payment.Verifier // one provider's: alipay.New(...), idemstripe.New(...)
	webhook, err := payment.NewWebhook(payment.Config{Verifier: verifier, Middleware: mw,
		Orders: idempotency.MySQLOrders, DB: db, Observe: payments.Observe})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /callbacks/alipay", webhook)
}
