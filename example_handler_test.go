package idempotency_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/orderguard/idempotency"
)

// One route protected: the Operation declares the action once (its route,
// the fields that make two requests the same order, its success status);
// the handler does every write in the record's transaction and never
// commits it. Requests without a usable key are refused before anything
// is read from the database, so this part runs without one; a runnable
// example over a real database is sqlite.Example_middleware.
func ExampleMiddleware_Handler() {
	// sql.Open connects lazily; a real service calls idempotency.Migrate
	// on it first.
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	createOrder := idempotency.Operation{
		Name:   "create_order",
		Route:  "POST /orders",
		Fields: []string{"user_id", "sku_id", "quantity"},
		Status: http.StatusCreated,
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Operation: &createOrder,
		// The principal that owns the key, in one canonical spelling.
		ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			SKUID    int64 `json:"sku_id"`
			Quantity int   `json:"quantity"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		tx, _ := idempotency.TxFromContext(r.Context())
		scope, key, _ := idempotency.KeyFromContext(r.Context())
		order := &idempotency.Order{OrderNo: "O-1", Scope: scope, IdempotencyKey: key, SKUID: req.SKUID, Quantity: req.Quantity}
		if err := idempotency.CreateOrder(r.Context(), tx, order); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Location", "/orders/"+order.OrderNo)
		w.WriteHeader(http.StatusCreated)
	})))

	for _, key := range []string{"", "two words"} {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"user_id":7,"sku_id":20001,"quantity":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", "7")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Content-Type"), strings.TrimSpace(rec.Body.String()))
	}
	// Output:
	// 400 application/problem+json {"type":"urn:orderguard:problem:missing-key","title":"Idempotency key required","status":400,"detail":"Send an Idempotency-Key header that stays the same for every retry of this action."}
	// 400 application/problem+json {"type":"urn:orderguard:problem:invalid-key","title":"Invalid idempotency key","status":400,"detail":"idempotency: invalid idempotency key: byte 0x20 at position 3 is not visible ASCII; must be 1-255 visible ASCII characters, optionally as a quoted string"}
}
