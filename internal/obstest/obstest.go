// Package obstest is the test order service that the tests of the Observer
// packages (metrics, tracing) drive: the real middleware and MySQL store,
// over a fresh MariaDB database from internal/testdb, around a handler that
// inserts a purchase_order row in the middleware's transaction.
//
// It is for tests only: every helper takes a testing.TB and fails the test
// on an error.
package obstest

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
	RouteOrders = "create_order" // POST /orders: inserts a purchase_order, answers 201
	RouteFlaky  = "flaky_order"  // POST /flaky: always answers 503
)

// Options are the hooks a test adds to the service. The zero value adds
// none.
type Options struct {
	// Wrap, if set, wraps the middleware of each request (and the handler
	// under it), as an HTTP server instrumentation would. A request counts
	// as served (see WaitServed) only once Wrap's handler has returned.
	Wrap func(http.Handler) http.Handler

	// WrapInsert, if set, runs the handler's insert of the order: it must
	// call insert, with ctx or a context derived from it, and return its
	// error. It runs inside the execute stage, in the middleware's
	// transaction.
	WrapInsert func(ctx context.Context, insert func(context.Context) error) error
}

// Service is a small order service, serving POST /orders and POST /flaky.
type Service struct {
	DB    *sql.DB           // the service's database
	Store idempotency.Store // the MySQL store the middleware uses

	// Entered receives a value when a handler asked to block (OrderRequest
	// Block) starts; the handler then waits for Release.
	Entered <-chan struct{}

	srv     *httptest.Server
	opts    Options
	entered chan struct{}
	unblock chan struct{}
	served  atomic.Int64 // requests that have left the middleware
	orders  atomic.Int64 // order number sequence
}

// NewService serves POST /orders and POST /flaky with obs as the Observer.
// Every request gets a Middleware of its own, as if each retry landed on
// another instance of the service: the claim and replay paths then always go
// through the store, so what obs sees does not depend on any in-process
// cache. The scope of a request is its X-Tenant header.
func NewService(t testing.TB, obs idempotency.Observer, opts Options) *Service {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	entered := make(chan struct{}, 1)
	s := &Service{
		DB: db, Store: idempotency.NewMySQLStore(db), Entered: entered,
		opts: opts, entered: entered, unblock: make(chan struct{}),
	}
	protect := func(route string, h http.Handler) http.Handler {
		cfg := idempotency.Config{
			Route: route, Observer: obs,
			ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		}
		// Fail here, not on the first request, if the config is invalid.
		_, err := idempotency.New(s.Store, &cfg)
		require.NoError(t, err)
		var protected http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mw, err := idempotency.New(s.Store, &cfg)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			mw.Handler(h).ServeHTTP(w, r)
		})
		if opts.Wrap != nil {
			protected = opts.Wrap(protected)
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer s.served.Add(1)
			protected.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", protect(RouteOrders, http.HandlerFunc(s.createOrder)))
	mux.Handle("POST /flaky", protect(RouteFlaky, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "inventory service unavailable", http.StatusServiceUnavailable)
	})))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.Release) // never leave a blocked handler behind
	return s
}

// OrderRequest is the body of POST /orders.
type OrderRequest struct {
	SKU      int64  `json:"sku_id"`
	Quantity int    `json:"quantity"`
	Note     string `json:"note,omitempty"`
	Block    bool   `json:"block,omitempty"`  // wait for Release before inserting
	Reject   bool   `json:"reject,omitempty"` // answer 422, a final business rejection
}

func (s *Service) createOrder(w http.ResponseWriter, r *http.Request) {
	var in OrderRequest
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
	insert := func(ctx context.Context) error { return idempotency.CreateOrder(ctx, tx, o) }
	var err error
	if s.opts.WrapInsert != nil {
		err = s.opts.WrapInsert(r.Context(), insert)
	} else {
		err = insert(r.Context())
	}
	if err != nil {
		http.Error(w, "could not create the order", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+o.OrderNo)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"order_no": o.OrderNo, "status": o.Status})
}

// Release unblocks every blocked handler, once; later calls do nothing.
func (s *Service) Release() {
	select {
	case <-s.unblock:
	default:
		close(s.unblock)
	}
}

// Call is one request to the service.
type Call struct {
	Path   string // defaults to /orders
	Tenant string // the X-Tenant header: the scope of the key
	Key    string // no Idempotency-Key header when empty
	Body   string // a JSON body
}

// Do sends c as a POST and returns the answer's status code and body.
func (s *Service) Do(t testing.TB, c Call) (int, string) {
	t.Helper()
	if c.Path == "" {
		c.Path = "/orders"
	}
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+c.Path, strings.NewReader(c.Body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", c.Tenant)
	if c.Key != "" {
		req.Header.Set("Idempotency-Key", c.Key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// WaitServed waits until n requests have left the middleware (and
// Options.Wrap), so that their final observations (made after the answer is
// written) are all in.
func (s *Service) WaitServed(t testing.TB, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return s.served.Load() == n }, 10*time.Second, time.Millisecond,
		"requests served: %d, want %d", s.served.Load(), n)
}

// Abandon claims a key as a crashed instance leaves it: PROCESSING, with a
// lease that has already expired.
func (s *Service) Abandon(t testing.TB, scope, key, fp string) {
	t.Helper()
	ctx := context.Background()
	_, err := s.Store.Claim(ctx, idempotency.Claim{
		Scope: scope, Key: key, Fingerprint: fp, Owner: "crashed-instance/" + key,
		Lease: time.Microsecond, Retention: time.Hour,
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := s.Store.Lookup(ctx, scope, key)
		return err == nil && rec.LeaseExpired
	}, 5*time.Second, time.Millisecond)
}

// Fingerprint is the default fingerprint of a POST /orders with body, as
// the middleware computes it.
func Fingerprint(t testing.TB, body string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	fp, err := idempotency.NewFingerprint(idempotency.FingerprintConfig{})(r, []byte(body))
	require.NoError(t, err)
	return fp
}

// MustJSON returns v encoded as JSON.
func MustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
