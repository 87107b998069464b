package orderservice_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// orderDialects are the databases the service's specs run on: the real
// MariaDB (a fresh database from testdb). The SQLite store lives in a
// module of its own (its dependencies stay out of this module); it passes
// storetest.Exercise there, and the example server's end-to-end tests run
// the service on it.
var orderDialects = []string{"mysql"}

// orderBundle is the order service over a fresh database, served on
// loopback.
type orderBundle struct {
	dialect string
	db      *sql.DB
	store   *idempotency.SQLStore
	svc     *orderservice.Service
	srv     *httptest.Server
}

// startOrderService sets up dialect's database and serves the service on it
// with opts; Store defaults to the dialect's store.
func startOrderService(t *testing.T, dialect string, opts orderservice.Options) *orderBundle {
	t.Helper()
	b := &orderBundle{dialect: dialect}
	switch dialect {
	case "mysql":
		b.db, _ = testdb.MySQL(t)
		b.store = idempotency.NewMySQLStore(b.db)
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	require.NoError(t, orderservice.Setup(context.Background(), b.db, dialect))
	if opts.Store == nil {
		opts.Store = b.store
	}
	svc, err := orderservice.New(b.db, opts)
	require.NoError(t, err)
	b.svc = svc
	b.srv = httptest.NewServer(svc)
	t.Cleanup(b.srv.Close)
	return b
}

// orderAnswer is a response read in full.
type orderAnswer struct {
	status int
	header http.Header
	body   string
}

func (a orderAnswer) problemKind(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), "body: %s", a.body)
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(a.body), &p))
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

func (a orderAnswer) order(t *testing.T) orderservice.OrderResponse {
	t.Helper()
	var o orderservice.OrderResponse
	require.NoError(t, json.Unmarshal([]byte(a.body), &o), "body: %s", a.body)
	return o
}

// create posts body to /orders as user (the raw X-User-ID value) with key.
func (b *orderBundle) create(t *testing.T, user, key, body string) orderAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return orderAnswer{status: resp.StatusCode, header: resp.Header, body: string(got)}
}

// orders counts purchase_order rows.
func (b *orderBundle) orders(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&n))
	return n
}

// records counts idempotency_record rows.
func (b *orderBundle) records(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM idempotency_record`).Scan(&n))
	return n
}
