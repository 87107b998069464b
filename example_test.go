package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"

	"github.com/orderguard/idempotency"
)

// Wrap the create-order handler. Its business writes go into the
// transaction the middleware opened; the order and the answer commit
// together, and every retry with the same Idempotency-Key gets the same
// answer. (A runnable version over SQLite is sqlite.Example_middleware.)
func Example() {
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	if err := idempotency.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		// The principal that owns the key, in one canonical spelling.
		ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Authenticated-User"), nil },
		// Only what changes the order counts.
		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		scope, key, _ := idempotency.KeyFromContext(r.Context())
		order := &idempotency.Order{OrderNo: "O-1", Scope: scope, IdempotencyKey: key, UserID: 1, SKUID: 20001, Quantity: 1}
		if err := idempotency.CreateOrder(r.Context(), tx, order); err != nil {
			status := http.StatusInternalServerError
			if idempotency.IsTransient(err) {
				w.Header().Set("Retry-After", "1")
				status = http.StatusServiceUnavailable
			}
			http.Error(w, err.Error(), status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_no":%q}`, order.OrderNo)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(createOrder))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}
