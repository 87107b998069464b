package metrics_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// Routes of the test service.
const (
	routeOrders = "create_order" // POST /orders: inserts a purchase_order, answers 201
	routeFlaky  = "flaky_order"  // POST /flaky: always answers 503
)

// service is a small order service over a fresh MariaDB database: the real
// middleware and MySQL store around a handler that inserts a purchase_order
// row in the middleware's transaction.
type service struct {
	db    *sql.DB
	store idempotency.Store
	srv   *httptest.Server

	// entered receives a value when a handler asked to block (body field
	// "block") starts; it then waits for unblock to be closed.
	entered chan struct{}
	unblock chan struct{}

	served atomic.Int64 // requests that have left the middleware
	orders atomic.Int64 // order number sequence
}

// newService serves POST /orders and POST /flaky with obs as the Observer.
// Every request gets a Middleware of its own, as if each retry landed on
// another instance of the service: the claim and replay paths then always go
// through the store, so stage counts do not depend on any in-process cache.
func newService(t *testing.T, obs idempotency.Observer) *service {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	s := &service{
		db: db, store: idempotency.NewMySQLStore(db),
		entered: make(chan struct{}, 1), unblock: make(chan struct{}),
	}
	protect := func(route string, h http.Handler) http.Handler {
		cfg := idempotency.Config{
			Route: route, Observer: obs,
			ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		}
		// Fail here, not on the first request, if the config is invalid.
		_, err := idempotency.New(s.store, &cfg)
		require.NoError(t, err)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer s.served.Add(1)
			mw, err := idempotency.New(s.store, &cfg)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			mw.Handler(h).ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", protect(routeOrders, http.HandlerFunc(s.createOrder)))
	mux.Handle("POST /flaky", protect(routeFlaky, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "inventory service unavailable", http.StatusServiceUnavailable)
	})))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.release) // never leave a blocked handler behind
	return s
}

// orderRequest is the body of POST /orders.
type orderRequest struct {
	SKU      int64  `json:"sku_id"`
	Quantity int    `json:"quantity"`
	Note     string `json:"note,omitempty"`
	Block    bool   `json:"block,omitempty"`  // wait for unblock before inserting
	Reject   bool   `json:"reject,omitempty"` // answer 422, a final business rejection
}

func (s *service) createOrder(w http.ResponseWriter, r *http.Request) {
	var in orderRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if in.Reject {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"sku out of stock"}`)
		return
	}
	if in.Block {
		s.entered <- struct{}{}
		select {
		case <-s.unblock:
		case <-r.Context().Done():
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
			return
		}
	}
	tx, ok := idempotency.TxFromContext(r.Context())
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	scope, key, _ := idempotency.KeyFromContext(r.Context())
	o := &idempotency.Order{
		OrderNo: fmt.Sprintf("O-%d-%d", time.Now().UnixNano(), s.orders.Add(1)),
		Scope:   scope, IdempotencyKey: key, UserID: 7, SKUID: in.SKU, Quantity: in.Quantity,
		UnitPriceCents: 1250, TotalCents: 1250 * int64(in.Quantity),
	}
	if err := idempotency.CreateOrder(r.Context(), tx, o); err != nil {
		http.Error(w, "could not create the order", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+o.OrderNo)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"order_no": o.OrderNo, "status": o.Status})
}

// release unblocks every blocked handler, once.
func (s *service) release() {
	select {
	case <-s.unblock:
	default:
		close(s.unblock)
	}
}

// call is one request to the service.
type call struct {
	path   string // defaults to /orders
	tenant string
	key    string // no Idempotency-Key header when empty
	body   string
}

func (s *service) do(t *testing.T, c call) (int, string) {
	t.Helper()
	if c.path == "" {
		c.path = "/orders"
	}
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+c.path, strings.NewReader(c.body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", c.tenant)
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// waitServed waits until n requests have left the middleware, so that their
// final observations (made after the answer is written) are all in.
func (s *service) waitServed(t *testing.T, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return s.served.Load() == n }, 10*time.Second, time.Millisecond,
		"requests served: %d, want %d", s.served.Load(), n)
}

// fingerprint is the default fingerprint of a POST /orders with body, as
// the middleware computes it.
func fingerprint(t *testing.T, body string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	fp, err := idempotency.NewFingerprint(idempotency.FingerprintConfig{})(r, []byte(body))
	require.NoError(t, err)
	return fp
}

// abandon claims a key as a crashed instance leaves it: PROCESSING, with a
// lease that has already expired.
func (s *service) abandon(t *testing.T, scope, key, fp string) {
	t.Helper()
	ctx := context.Background()
	_, err := s.store.Claim(ctx, idempotency.Claim{
		Scope: scope, Key: key, Fingerprint: fp, Owner: "crashed-instance/" + key,
		Lease: time.Microsecond, Retention: time.Hour,
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := s.store.Lookup(ctx, scope, key)
		return err == nil && rec.LeaseExpired
	}, 5*time.Second, time.Millisecond)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
