package sqlite_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/sqlite"
)

// A retried create replays the first answer; a changed request under the
// same key is refused; only one order exists.
func Example_middleware() {
	dir, _ := os.MkdirTemp("", "idempotency-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "orders.db"))
	defer db.Close()
	_ = sqlite.Migrate(context.Background(), db)

	mw, _ := idempotency.New(sqlite.NewStore(db), &idempotency.Config{
		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}},
	})
	created := 0
	handler := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		scope, key, _ := idempotency.KeyFromContext(r.Context())
		created++
		order := &idempotency.Order{OrderNo: fmt.Sprint("O-", created), Scope: scope, IdempotencyKey: key,
			UserID: 1, SKUID: 20001, Quantity: 1}
		if err := idempotency.CreateOrder(r.Context(), tx, order); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_no":%q}`, order.OrderNo)
	}))

	send := func(body string) {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "agent-run-7f3a91c4/call-1")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), strings.TrimSpace(rec.Body.String()))
	}
	send(`{"sku_id":20001,"quantity":1}`)
	send(`{"quantity":1,"sku_id":20001,"trace_id":"retry-2"}`) // a retry: same action
	send(`{"sku_id":20001,"quantity":2}`)                      // a changed request: refused

	var orders int
	_ = db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// 201  {"order_no":"O-1"}
	// 201 true {"order_no":"O-1"}
	// 409  {"type":"urn:orderguard:problem:key-reused","title":"Idempotency key reused","status":409,"detail":"This key was already used with a different request. Use a new key for a new action."}
	// orders: 1
}
