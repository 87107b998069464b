package ordergrpc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	idemgrpc "github.com/orderguard/idempotency/grpc"
	"github.com/orderguard/idempotency/internal/testdb"
)

// bundle is the order service over gRPC and HTTP on one MariaDB database.
type bundle struct {
	db   *frontendtest.Env
	grpc orderpb.OrderServiceClient
	addr string
	http string
	keys *seenKeys
}

func setup(t *testing.T, cfg idempotency.Config, store func(db *frontendtest.Env) idempotency.Store) *bundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, orderservice.Setup(context.Background(), db, "mysql"))
	env := &frontendtest.Env{DB: db, Dialect: "mysql", Mode: cfg.Mode}
	var s idempotency.Store = idempotency.NewMySQLStore(db)
	if store != nil {
		s = store(env)
	}
	svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: s, Config: cfg})
	require.NoError(t, err)
	env.Service = svc
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	keys := &seenKeys{}
	c, addr := serve(t, env, grpc.ChainUnaryInterceptor(keys.record))
	return &bundle{db: env, grpc: c, addr: addr, http: srv.URL, keys: keys}
}

func (b *bundle) orders(t *testing.T, user int64, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.DB.QueryRow("SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ?",
		strconv.FormatInt(user, 10), key).Scan(&n))
	return n
}

func call(user int64, key string) context.Context {
	md := metadata.Pairs(ordergrpc.UserMetadata, strconv.FormatInt(user, 10))
	if key != "" {
		md.Set(idemgrpc.MetadataKey, key)
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

func createReq(user int64, quantity int32) *orderpb.CreateOrderRequest {
	return &orderpb.CreateOrderRequest{UserId: user, SkuId: orderservice.FirstSKU, Quantity: quantity}
}

func errorInfo(t *testing.T, st *status.Status) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	t.Fatalf("no ErrorInfo in %v", st.Proto())
	return nil
}

// 64 concurrent calls of one key make one order, in both modes, and every
// call ends (retried as the client interceptor retries) with that order.
func TestCreateOrder_64ConcurrentCallsOfOneKey_OneOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		t.Run(strconv.Itoa(int(mode)), func(t *testing.T) {
			t.Parallel()
			b := setup(t, idempotency.Config{Mode: mode}, nil)
			orders := make([]*orderpb.Order, 64)
			errs := make([]error, 64)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range orders {
				wg.Go(func() {
					<-start
					ctx := idemgrpc.WithKey(call(7, ""), "storm-64")
					orders[i], errs[i] = b.retrying(t).CreateOrder(ctx, createReq(7, 1))
				})
			}
			close(start)
			wg.Wait()
			for i := range orders {
				require.NoError(t, errs[i], "call %d", i)
				require.True(t, proto.Equal(orders[0], orders[i]), "call %d got another order: %v, %v", i, orders[0], orders[i])
			}
			require.Equal(t, 1, b.orders(t, 7, "storm-64"))
		})
	}
}

// retrying is a client whose calls go through the client interceptor.
func (b *bundle) retrying(t *testing.T) orderpb.OrderServiceClient {
	return b.retryingWith(t, client.Policy{InitialDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond})
}

func (b *bundle) retryingWith(t *testing.T, p client.Policy) orderpb.OrderServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(p)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return orderpb.NewOrderServiceClient(conn)
}

// seenKeys records the idempotency-key of every call the server received.
type seenKeys struct {
	mu   sync.Mutex
	keys []string
}

func (s *seenKeys) record(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.keys = append(s.keys, md.Get(idemgrpc.MetadataKey)...)
	s.mu.Unlock()
	return handler(ctx, req)
}

func (s *seenKeys) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// failingClaims fails the first n claims as a server that turned read-only
// in a failover does (1290): nothing landed, the attempt is answered 503.
type failingClaims struct {
	idempotency.Store
	n atomic.Int32
}

func (f *failingClaims) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	if f.n.Add(-1) >= 0 {
		return idempotency.Lease{}, &mysql.MySQLError{Number: 1290, Message: "The MariaDB server is running with the --read-only option"}
	}
	return f.Store.Claim(ctx, c)
}

// The client interceptor makes one key for a call and sends it on every
// attempt: two UNAVAILABLE answers, then the order, all under one key; a
// final answer (KEY_REUSED) is not retried.
func TestClientInterceptor_OneKeyAcrossRetries_OnlyRetryableAnswersRetried(t *testing.T) {
	t.Parallel()
	var store *failingClaims
	b := setup(t, idempotency.Config{}, func(env *frontendtest.Env) idempotency.Store {
		store = &failingClaims{Store: idempotency.NewMySQLStore(env.DB)}
		store.n.Store(2)
		return store
	})
	c := b.retrying(t)
	order, err := c.CreateOrder(call(7, ""), createReq(7, 1))
	require.NoError(t, err)
	keys := b.keys.all()
	require.Len(t, keys, 3, "two UNAVAILABLE answers retried, then the order")
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, keys[0], keys[2], "one key for every attempt of the call")
	require.NoError(t, client.CheckKey(keys[0]))
	require.Equal(t, 1, b.orders(t, 7, keys[0]))

	// WithKey's key is the call's; the same key with another request is
	// final: one attempt.
	before := len(b.keys.all())
	_, err = c.CreateOrder(idemgrpc.WithKey(call(7, ""), keys[0]), createReq(7, 4))
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.Len(t, b.keys.all(), before+1, "KEY_REUSED is not retried")
	again, err := c.CreateOrder(idemgrpc.WithKey(call(7, ""), keys[0]), createReq(7, 1))
	require.NoError(t, err)
	require.True(t, proto.Equal(order, again), "the key's order, replayed")
}

// The same key with another request is FAILED_PRECONDITION, ErrorInfo
// KEY_REUSED, never executed; the first order stands.
func TestCreateOrder_ChangedRequestUnderAKey_FailedPreconditionNothingWritten(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	first, err := b.grpc.CreateOrder(call(7, "changed"), createReq(7, 1))
	require.NoError(t, err)
	_, err = b.grpc.CreateOrder(call(7, "changed"), createReq(7, 2))
	st := status.Convert(err)
	require.Equal(t, codes.FailedPrecondition, st.Code(), "%v", st.Proto())
	info := errorInfo(t, st)
	require.Equal(t, "KEY_REUSED", info.GetReason())
	require.Equal(t, idemgrpc.ErrorDomain, info.GetDomain())
	require.Equal(t, 1, b.orders(t, 7, "changed"))
	var quantity int
	require.NoError(t, b.db.DB.QueryRow("SELECT quantity FROM purchase_order WHERE order_no = ?", first.GetOrderNo()).Scan(&quantity))
	require.Equal(t, 1, quantity, "the first order is untouched")
}

// With the database unreachable the call is UNAVAILABLE with a RetryInfo,
// and nothing ran.
func TestCreateOrder_DatabaseUnreachable_UnavailableWithRetryInfo(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, func(*frontendtest.Env) idempotency.Store {
		return frontendtest.MySQL.Unreachable(t)
	})
	_, err := b.grpc.CreateOrder(call(7, "unreachable"), createReq(7, 1))
	st := status.Convert(err)
	require.Equal(t, codes.Unavailable, st.Code(), "%v", st.Proto())
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	require.NotNil(t, retry, "UNAVAILABLE says when to retry: %v", st.Proto())
	require.Positive(t, retry.GetRetryDelay().AsDuration())
	require.Equal(t, "STORE_UNAVAILABLE", errorInfo(t, st).GetReason())
	require.Zero(t, b.orders(t, 7, "unreachable"))
}

// A key used over HTTP is the same action over gRPC: the call replays the
// HTTP order, marked idempotent-replayed; other fields are KEY_REUSED.
func TestCreateOrder_AKeyUsedOverHTTP_IsReplayedOverGRPC(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	h := frontendtest.HTTP(b.http).Create(context.Background(), frontendtest.Request{User: 7, Key: "both", SKU: orderservice.FirstSKU, Quantity: 1})
	require.Equal(t, 201, h.Status, "%s", h)

	var header metadata.MD
	order, err := b.grpc.CreateOrder(call(7, "both"), createReq(7, 1), grpc.Header(&header))
	require.NoError(t, err)
	require.Equal(t, []string{"true"}, header.Get(idemgrpc.ReplayedKey))
	require.Equal(t, []string{"/orders/" + h.OrderNo}, header.Get("location"), "the HTTP answer's Location, as metadata")
	require.Equal(t, h.OrderNo, order.GetOrderNo(), "the HTTP order, replayed")
	require.Equal(t, int64(1000), order.GetTotalCents())

	_, err = b.grpc.CreateOrder(call(7, "both"), createReq(7, 5))
	require.Equal(t, "KEY_REUSED", errorInfo(t, status.Convert(err)).GetReason())
	require.Equal(t, 1, b.orders(t, 7, "both"))

	// And the other way: a key used over gRPC replays over HTTP.
	g, err := b.grpc.CreateOrder(call(7, "grpc-first"), createReq(7, 2))
	require.NoError(t, err)
	again := frontendtest.HTTP(b.http).Create(context.Background(), frontendtest.Request{User: 7, Key: "grpc-first", SKU: orderservice.FirstSKU, Quantity: 2})
	require.Equal(t, 201, again.Status, "%s", again)
	require.True(t, again.Replayed, "%s", again)
	require.Equal(t, g.GetOrderNo(), again.OrderNo)
	require.Equal(t, 1, b.orders(t, 7, "grpc-first"))
}

// Without x-user-id the call is UNAUTHENTICATED; without a key,
// INVALID_ARGUMENT MISSING_KEY; nothing is written either way.
func TestCreateOrder_NoPrincipalOrNoKey_RefusedBeforeAnythingIsWritten(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	_, err := b.grpc.CreateOrder(metadata.NewOutgoingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, "k")), createReq(7, 1))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = b.grpc.CreateOrder(call(7, ""), createReq(7, 1))
	st := status.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code())
	require.Equal(t, "MISSING_KEY", errorInfo(t, st).GetReason())
	var records int
	require.NoError(t, b.db.DB.QueryRow("SELECT COUNT(*) FROM idempotency_record").Scan(&records))
	require.Zero(t, records)
}

// post sends POST /orders as an HTTP client does, and returns the answer's
// status, headers and body.
func (b *bundle) post(t *testing.T, user int64, key, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.http+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", strconv.FormatInt(user, 10))
	req.Header.Set("Idempotency-Key", key)
	return b.do(t, req)
}

func (b *bundle) do(t *testing.T, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, body
}

// A create made over gRPC and replayed over HTTP is the HTTP route's own
// answer: 201, Location /orders/{order_no}, and the order as the route
// writes it (every field, coupon_id null without a coupon, integers as
// numbers); the gRPC answer carries the location too, and its replay over
// gRPC decodes the record back into the same order.
func TestCreateOrder_MadeOverGRPC_ReplayedOverHTTPAsTheHTTPRouteAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	coupon := int64(orderservice.FirstCoupon)
	for _, tc := range []struct {
		name   string
		coupon *int64
		body   string
	}{
		{"no-coupon", nil, fmt.Sprintf(`{"user_id":7,"sku_id":%d,"quantity":2}`, orderservice.FirstSKU)},
		{"a-coupon", &coupon, fmt.Sprintf(`{"user_id":7,"sku_id":%d,"quantity":2,"coupon_id":%d}`, orderservice.FirstSKU, coupon)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The HTTP route's own first answer, for its shape.
			httpStatus, httpHeader, httpBody := b.post(t, 7, "over-http-"+tc.name, fmt.Sprintf(`{"user_id":7,"sku_id":%d,"quantity":2}`, orderservice.FirstSKU))
			require.Equal(t, http.StatusCreated, httpStatus, "%s", httpBody)

			key := "over-grpc-" + tc.name
			req := createReq(7, 2)
			req.CouponId = tc.coupon
			var header metadata.MD
			order, err := b.grpc.CreateOrder(call(7, key), req, grpc.Header(&header))
			require.NoError(t, err)
			location := "/orders/" + order.GetOrderNo()
			require.Equal(t, []string{location}, header.Get("location"), "the gRPC answer carries the HTTP route's Location")

			status, replayHeader, body := b.post(t, 7, key, tc.body)
			require.Equal(t, http.StatusCreated, status, "%s", body)
			require.Equal(t, "true", replayHeader.Get("Idempotent-Replayed"))
			require.Equal(t, location, replayHeader.Get("Location"))
			require.Equal(t, httpHeader.Get("Content-Type"), replayHeader.Get("Content-Type"))

			// The HTTP route's JSON of this very order, as GET /orders/{no}
			// writes it.
			get, err := http.NewRequest(http.MethodGet, b.http+location, nil)
			require.NoError(t, err)
			get.Header.Set("X-User-ID", "7")
			getStatus, _, routeBody := b.do(t, get)
			require.Equal(t, http.StatusOK, getStatus, "%s", routeBody)
			// GET shows the payment facts too (currency, refunded_cents),
			// which a create's answer does not carry.
			var view map[string]any
			require.NoError(t, json.Unmarshal(routeBody, &view))
			delete(view, "currency")
			delete(view, "refunded_cents")
			routeBody, err = json.Marshal(view)
			require.NoError(t, err)
			require.JSONEq(t, string(routeBody), string(body))
			require.Equal(t, jsonKeys(t, httpBody), jsonKeys(t, body), "the fields of the HTTP route's create answer")
			require.True(t, strings.HasSuffix(string(body), "}\n"), "a final newline, as the route writes: %q", body)

			var again metadata.MD
			replayed, err := b.grpc.CreateOrder(call(7, key), req, grpc.Header(&again))
			require.NoError(t, err)
			require.True(t, proto.Equal(order, replayed), "%v\n%v", order, replayed)
			require.Equal(t, []string{location}, again.Get("location"), "the location is replayed over gRPC too")
		})
	}
}

// jsonKeys is a JSON object's field names, sorted.
func jsonKeys(t *testing.T, body []byte) []string {
	t.Helper()
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &fields), "%s", body)
	return slices.Sorted(maps.Keys(fields))
}
