package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/sqlite"
)

var update = flag.Bool("update", false, "rewrite docs/create_order.tool.json from the server")

const toolFile = "../../docs/create_order.tool.json"

// orderAPI is a real example order service (SQLite, idempotency on) on
// httptest, counting the requests that reach it.
type orderAPI struct {
	URL      string
	HTTP     *http.Client
	db       *sql.DB
	requests atomic.Int64 // HTTP requests that reached the order API
}

// startOrderAPI starts the order service in a fresh database. before, when
// not nil, runs first on every request (tests use it to hold a call in
// flight).
func startOrderAPI(t *testing.T, before func(*http.Request)) *orderAPI {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := orderservice.Setup(ctx, db, "sqlite"); err != nil {
		t.Fatal(err)
	}
	svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: sqlite.NewStore(db)})
	if err != nil {
		t.Fatal(err)
	}
	a := &orderAPI{db: db}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.requests.Add(1)
		if before != nil {
			before(r)
		}
		svc.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	a.URL, a.HTTP = ts.URL, ts.Client()
	return a
}

func (a *orderAPI) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := a.db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// env is the order API, the MCP server over it, and an MCP client session
// connected in memory.
type env struct {
	*orderAPI
	cs *mcp.ClientSession
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	a := startOrderAPI(t, nil)
	srv := NewServer(a.URL, &client.Client{HTTP: a.HTTP})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return &env{orderAPI: a, cs: cs}
}

func (e *env) call(t *testing.T, tool string, args map[string]any) (*mcp.CallToolResult, WriteResult) {
	t.Helper()
	return callTool(t, e.cs, tool, args)
}

// callTool calls tool over cs, failing the test on a protocol error, and
// decodes the structured result.
func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, WriteResult) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", tool, err)
	}
	var out WriteResult
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s: structured content %s: %v", tool, b, err)
		}
	}
	return res, out
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func createArgs(key string, quantity int) map[string]any {
	args := map[string]any{"user_id": 7, "sku_id": 20005, "quantity": quantity, "coupon_id": 3}
	if key != "" {
		args["idempotency_key"] = key
	}
	return args
}

func TestCreateOrderRoundTrip(t *testing.T) {
	e := newEnv(t)
	key := client.KeyFor("run-1", "call-1")
	res, out := e.call(t, "create_order", createArgs(key, 2))
	if res.IsError {
		t.Fatalf("create_order failed: %s", text(res))
	}
	if out.Order == nil || out.Replayed || out.Attempts != 1 {
		t.Fatalf("result = %+v, want a new order in 1 attempt", out)
	}
	o := out.Order
	if o.UserID != 7 || o.SKUID != 20005 || o.Quantity != 2 || o.CouponID == nil || *o.CouponID != 3 || o.Status != "CREATED" {
		t.Fatalf("order = %+v", o)
	}
	if want := 2*orderservice.SKUPriceCents(20005) - orderservice.CouponDiscountCents; o.TotalCents != want {
		t.Errorf("total = %d, want %d", o.TotalCents, want)
	}
	if n := e.orders(t); n != 1 {
		t.Fatalf("orders in DB = %d, want 1", n)
	}
	// The key reached the API unchanged: the order row carries it.
	var stored string
	if err := e.db.QueryRow(`SELECT idempotency_key FROM purchase_order WHERE order_no = ?`, o.OrderNo).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != key {
		t.Errorf("stored key = %q, want the caller's %q", stored, key)
	}
}

func TestCreateOrderSameKeyReplays(t *testing.T) {
	e := newEnv(t)
	key := client.KeyFor("run-1", "intent-1")
	args := createArgs(key, 1)
	args["request_id"] = "req-1"
	res, first := e.call(t, "create_order", args)
	if res.IsError || first.Order == nil {
		t.Fatalf("first call: %s", text(res))
	}
	// The incident: the agent calls again after a timeout, with a new
	// request id. The same key returns the same order, replayed.
	args["request_id"] = "req-2-after-timeout"
	res, second := e.call(t, "create_order", args)
	if res.IsError || second.Order == nil {
		t.Fatalf("second call: %s", text(res))
	}
	if !second.Replayed {
		t.Errorf("second call replayed = false, want true")
	}
	if second.Order.OrderNo != first.Order.OrderNo {
		t.Errorf("second order %s, want the first %s", second.Order.OrderNo, first.Order.OrderNo)
	}
	if n := e.orders(t); n != 1 {
		t.Fatalf("orders in DB = %d, want exactly 1", n)
	}
}

func TestCreateOrderRequiresKey(t *testing.T) {
	e := newEnv(t)
	for name, key := range map[string]any{"missing": nil, "empty": "", "space": "has space", "non-ascii": "ключ", "too long": strings.Repeat("k", 256)} {
		t.Run(name, func(t *testing.T) {
			args := createArgs("", 1)
			if key != nil {
				args["idempotency_key"] = key
			}
			res, _ := e.call(t, "create_order", args)
			if !res.IsError {
				t.Fatalf("call without a valid key succeeded: %s", text(res))
			}
			if !strings.Contains(text(res), "idempotency_key") {
				t.Errorf("error %q does not name idempotency_key", text(res))
			}
		})
	}
	if n := e.requests.Load(); n != 0 {
		t.Errorf("%d requests reached the API, want none", n)
	}
	if n := e.orders(t); n != 0 {
		t.Errorf("orders in DB = %d, want 0", n)
	}
}

// The handler refuses a bad key by itself too (with its problem kind), not
// only through the schema.
func TestHandlerChecksKey(t *testing.T) {
	a := &api{base: "http://127.0.0.1:1", c: &client.Client{}}
	for key, kind := range map[string]string{"": KindMissingKey, "a b": KindInvalidKey, strings.Repeat("x", 256): KindInvalidKey} {
		res, out, err := a.createOrder(context.Background(), nil, CreateOrderInput{UserID: 1, SKUID: 20001, Quantity: 1, IdempotencyKey: key})
		if err != nil || res == nil || !res.IsError || out.Problem == nil || out.Problem.Kind != kind {
			t.Errorf("key %q: res=%+v out=%+v err=%v, want tool error %s", key, res, out, err, kind)
		}
		res, out, err = a.cancelOrder(context.Background(), nil, CancelOrderInput{UserID: 1, OrderNo: "O1", IdempotencyKey: key})
		if err != nil || res == nil || !res.IsError || out.Problem == nil || out.Problem.Kind != kind {
			t.Errorf("cancel key %q: res=%+v out=%+v err=%v, want tool error %s", key, res, out, err, kind)
		}
	}
}

func TestCreateOrderKeyReused(t *testing.T) {
	e := newEnv(t)
	key := client.KeyFor("run-1", "intent-1")
	if res, _ := e.call(t, "create_order", createArgs(key, 1)); res.IsError {
		t.Fatalf("first call: %s", text(res))
	}
	res, out := e.call(t, "create_order", createArgs(key, 5))
	if !res.IsError {
		t.Fatalf("same key, different quantity succeeded: %+v", out)
	}
	if out.Problem == nil || out.Problem.Kind != client.ProblemKeyReused || out.Problem.Status != http.StatusConflict {
		t.Fatalf("problem = %+v, want key-reused 409", out.Problem)
	}
	if !strings.HasPrefix(text(res), "key-reused (HTTP 409)") {
		t.Errorf("error text %q does not start with the problem kind", text(res))
	}
	if n := e.orders(t); n != 1 {
		t.Fatalf("orders in DB = %d, want 1", n)
	}
}

func TestGetAndCancelOrder(t *testing.T) {
	e := newEnv(t)
	res, created := e.call(t, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 3))
	if res.IsError {
		t.Fatalf("create: %s", text(res))
	}
	no := created.Order.OrderNo

	res, got := e.call(t, "get_order", map[string]any{"user_id": 7, "order_no": no})
	if res.IsError || got.Order == nil || !reflect.DeepEqual(got.Order, created.Order) {
		t.Fatalf("get_order = %s, want %+v", text(res), created.Order)
	}

	cancelKey := client.KeyFor("run-1", "cancel-1")
	cancel := map[string]any{"user_id": 7, "order_no": no, "idempotency_key": cancelKey}
	res, canceled := e.call(t, "cancel_order", cancel)
	if res.IsError || canceled.Order == nil || canceled.Order.Status != "CANCELED" || canceled.Replayed {
		t.Fatalf("cancel_order = %s", text(res))
	}
	res, again := e.call(t, "cancel_order", cancel)
	if res.IsError || !again.Replayed || again.Order.Status != "CANCELED" {
		t.Fatalf("repeated cancel_order = %s, want the replayed answer", text(res))
	}
	// A different key is a new cancel attempt, refused by the state machine.
	cancel["idempotency_key"] = client.KeyFor("run-1", "cancel-2")
	res, out := e.call(t, "cancel_order", cancel)
	if !res.IsError || out.Problem == nil || out.Problem.Kind != orderservice.ProblemInvalidTransition {
		t.Fatalf("cancel of a canceled order = %s, want invalid-transition", text(res))
	}
	delete(cancel, "idempotency_key")
	if res, _ := e.call(t, "cancel_order", cancel); !res.IsError {
		t.Fatalf("cancel_order without a key succeeded")
	}

	res, got = e.call(t, "get_order", map[string]any{"user_id": 7, "order_no": no})
	if res.IsError || got.Order.Status != "CANCELED" {
		t.Fatalf("get_order after cancel = %s", text(res))
	}
	// Another user's order and an unknown one are not found.
	for _, args := range []map[string]any{{"user_id": 8, "order_no": no}, {"user_id": 7, "order_no": "Onope"}} {
		res, out := e.call(t, "get_order", args)
		if !res.IsError || out.Problem == nil || out.Problem.Kind != orderservice.ProblemNotFound {
			t.Errorf("get_order %v = %s, want not-found", args, text(res))
		}
	}
}

func TestAPIDownIsUnavailable(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	base := ts.URL
	ts.Close() // nothing listens there now
	srv := NewServer(base, &client.Client{Policy: client.Policy{MaxAttempts: 2}})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "v0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_order", Arguments: createArgs("k-1", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.HasPrefix(text(res), KindUnavailable) || !strings.Contains(text(res), "same idempotency_key") {
		t.Fatalf("result %q, want an unavailable tool error telling to retry with the same key", text(res))
	}
}

// docs/create_order.tool.json is exactly what the server advertises, so the
// published schema cannot drift from the code. Run with -update to rewrite it.
func TestToolSchemaFile(t *testing.T) {
	e := newEnv(t)
	var tools []*mcp.Tool
	for tool, err := range e.cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, tool)
	}
	var names []string
	var create *mcp.Tool
	for _, tool := range tools {
		names = append(names, tool.Name)
		if tool.Name == "create_order" {
			create = tool
		}
	}
	if want := []string{"cancel_order", "create_order", "get_order"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}
	got, err := json.MarshalIndent(create, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(toolFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(toolFile)
	if err != nil {
		t.Fatalf("%v (run go test ./examples/mcpserver -run TestToolSchemaFile -update)", err)
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: %v", toolFile, err)
	}
	if !reflect.DeepEqual(g, w) || !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the advertised create_order tool (run with -update):\n%s", toolFile, got)
	}
	// The essentials, in case both were changed together.
	schema := w.(map[string]any)["inputSchema"].(map[string]any)
	required := schema["required"].([]any)
	if !reflect.DeepEqual(required, []any{"user_id", "sku_id", "quantity", "idempotency_key"}) {
		t.Errorf("required = %v", required)
	}
	props := schema["properties"].(map[string]any)
	for _, p := range []string{"user_id", "sku_id", "quantity", "coupon_id", "idempotency_key"} {
		if props[p] == nil {
			t.Errorf("inputSchema lacks %s", p)
		}
	}
}
