package crosstransport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/orderguard/idempotency"
	idemecho "github.com/orderguard/idempotency/adapters/echo"
	idemgin "github.com/orderguard/idempotency/adapters/gin"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemgrpc "github.com/orderguard/idempotency/grpc"
	"github.com/orderguard/idempotency/internal/brokertest"
)

// transport is one front-end of the example service, as its client sees
// it.
type transport struct {
	name   string
	create func(ctx context.Context, t *testing.T, user int64, key string, quantity int) answer
	cancel func(ctx context.Context, t *testing.T, user int64, key, orderNo string) answer
}

// answer is a transport's answer in the contract's terms.
type answer struct {
	// Status is the HTTP status; over gRPC, OK is the operation's success
	// status and an error its code's (idemgrpc.ContractAnswer).
	Status   int
	Kind     string // a problem's kind, "" for an order
	Replayed bool
	Location string
	// Order is the order as JSON decodes it: numbers as float64, null as
	// nil; a gRPC Order is written as the HTTP route writes an order.
	Order map[string]any
	Raw   string
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s replayed=%v location=%q %.300s", a.Status, a.Kind, a.Replayed, a.Location, a.Raw)
}

func scopeOf(user int64) string { return strconv.FormatInt(user, 10) }

func createBody(user int64, quantity int) []byte {
	return fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":%d}`, user, orderservice.FirstSKU, quantity)
}

// httpAnswer reads an answer of the HTTP contract, which the queues'
// replies carry too.
func httpAnswer(t *testing.T, statusCode int, h http.Header, body []byte) answer {
	t.Helper()
	a := answer{Status: statusCode, Replayed: h.Get("Idempotent-Replayed") == "true", Location: h.Get("Location"), Raw: string(body)}
	switch h.Get("Content-Type") {
	case "application/json":
		require.NoError(t, json.Unmarshal(body, &a.Order), "%s", body)
	case "application/problem+json":
		var p struct{ Type string }
		require.NoError(t, json.Unmarshal(body, &p), "%s", body)
		a.Kind = strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
	}
	return a
}

// overHTTPClient is the HTTP contract's client of baseURL: POST /orders
// and POST /orders/{order_no}/cancel with X-User-ID and Idempotency-Key.
func overHTTPClient(name, baseURL string) transport {
	send := func(ctx context.Context, t *testing.T, user int64, key, path string, body []byte) answer {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, bytes.NewReader(body))
		require.NoError(t, err)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("X-User-ID", scopeOf(user))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return httpAnswer(t, resp.StatusCode, resp.Header, b)
	}
	return transport{
		name: name,
		create: func(ctx context.Context, t *testing.T, user int64, key string, quantity int) answer {
			return send(ctx, t, user, key, "/orders", createBody(user, quantity))
		},
		cancel: func(ctx context.Context, t *testing.T, user int64, key, orderNo string) answer {
			return send(ctx, t, user, key, "/orders/"+orderNo+"/cancel", nil)
		},
	}
}

func serveHTTP(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// overHTTP is the example's own net/http server.
func overHTTP(t *testing.T, name string, svc *orderservice.Service) transport {
	return overHTTPClient(name, serveHTTP(t, svc))
}

// overGin serves the routes as a gin application writes them, each
// handler wrapped by idemgin.Wrap with the route's Middleware.
func overGin(t *testing.T, svc *orderservice.Service) transport {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	authenticate := func(c *gin.Context) {
		if _, p := orderservice.Principal(c.Request); p != nil {
			idempotency.WriteProblem(c.Writer, p)
			c.Abort()
		}
	}
	write := func(c *gin.Context, reply orderservice.Reply) {
		for k, v := range reply.Header {
			c.Header(k, v[0])
		}
		ct, body := reply.Body()
		c.Data(reply.StatusCode(), ct, body)
	}
	r.POST("/orders", authenticate, func(c *gin.Context) {
		if p := orderservice.CheckCreate(c.Writer, c.Request); p != nil {
			idempotency.WriteProblem(c.Writer, p)
			c.Abort()
		}
	}, idemgin.Wrap(svc.Middleware("create_order"), func(c *gin.Context) { write(c, svc.CreateFromHTTP(c.Request)) }))
	r.POST("/orders/:order_no/cancel", authenticate, idemgin.Wrap(svc.Middleware("cancel_order"),
		func(c *gin.Context) { write(c, svc.CancelFromHTTP(c.Request, c.Param("order_no"))) }))
	return overHTTPClient("gin", serveHTTP(t, r))
}

// overEcho serves the routes as an echo application writes them, behind
// idemecho.Middleware with the route's Middleware.
func overEcho(t *testing.T, svc *orderservice.Service) transport {
	e := echo.New()
	authenticate := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if _, p := orderservice.Principal(c.Request()); p != nil {
				idempotency.WriteProblem(c.Response(), p)
				return nil
			}
			return next(c)
		}
	}
	checkCreate := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if p := orderservice.CheckCreate(c.Response(), c.Request()); p != nil {
				idempotency.WriteProblem(c.Response(), p)
				return nil
			}
			return next(c)
		}
	}
	write := func(c echo.Context, reply orderservice.Reply) error {
		for k, v := range reply.Header {
			c.Response().Header().Set(k, v[0])
		}
		ct, body := reply.Body()
		return c.Blob(reply.StatusCode(), ct, body)
	}
	e.POST("/orders", func(c echo.Context) error { return write(c, svc.CreateFromHTTP(c.Request())) },
		authenticate, checkCreate, idemecho.Middleware(svc.Middleware("create_order")))
	e.POST("/orders/:order_no/cancel", func(c echo.Context) error {
		return write(c, svc.CancelFromHTTP(c.Request(), c.Param("order_no")))
	}, authenticate, idemecho.Middleware(svc.Middleware("cancel_order")))
	return overHTTPClient("echo", serveHTTP(t, e))
}

// overGRPC is the example's gRPC server (ordergrpc) and an orderpb
// client.
func overGRPC(t *testing.T, svc *orderservice.Service) transport {
	srv, err := ordergrpc.New(svc)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	client := orderpb.NewOrderServiceClient(conn)

	call := func(ctx context.Context, t *testing.T, user int64, key string, okStatus int,
		rpc func(ctx context.Context, opts ...grpc.CallOption) (*orderpb.Order, error)) answer {
		t.Helper()
		ctx = metadata.AppendToOutgoingContext(ctx, ordergrpc.UserMetadata, scopeOf(user), idemgrpc.MetadataKey, key)
		var header metadata.MD
		o, err := rpc(ctx, grpc.Header(&header))
		a := answer{Replayed: first(header, idemgrpc.ReplayedKey) == "true", Location: first(header, "location")}
		if err != nil {
			st := status.Convert(err)
			a.Status, a.Kind, _ = idemgrpc.ContractAnswer(st)
			a.Raw = st.String()
			return a
		}
		a.Status, a.Order, a.Raw = okStatus, orderJSON(o), o.String()
		return a
	}
	return transport{
		name: "grpc",
		create: func(ctx context.Context, t *testing.T, user int64, key string, quantity int) answer {
			return call(ctx, t, user, key, http.StatusCreated, func(ctx context.Context, opts ...grpc.CallOption) (*orderpb.Order, error) {
				return client.CreateOrder(ctx, &orderpb.CreateOrderRequest{UserId: user, SkuId: orderservice.FirstSKU, Quantity: int32(quantity)}, opts...)
			})
		},
		cancel: func(ctx context.Context, t *testing.T, user int64, key, orderNo string) answer {
			return call(ctx, t, user, key, http.StatusOK, func(ctx context.Context, opts ...grpc.CallOption) (*orderpb.Order, error) {
				return client.CancelOrder(ctx, &orderpb.CancelOrderRequest{OrderNo: orderNo}, opts...)
			})
		},
	}
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// orderJSON is a gRPC Order as the HTTP route writes an order
// (orderservice.OrderResponse), decoded as JSON decodes it.
func orderJSON(o *orderpb.Order) map[string]any {
	var coupon any
	if o.CouponId != nil {
		coupon = float64(*o.CouponId)
	}
	return map[string]any{
		"order_no": o.OrderNo, "status": o.Status, "user_id": float64(o.UserId), "sku_id": float64(o.SkuId),
		"quantity": float64(o.Quantity), "coupon_id": coupon, "unit_price_cents": float64(o.UnitPriceCents),
		"discount_cents": float64(o.DiscountCents), "total_cents": float64(o.TotalCents),
	}
}

// overQueue is the example's consumers on broker ("nats" or "amqp"), one
// per action on a topology of this test's own, and a publisher that asks
// for a reply.
func overQueue(t *testing.T, broker string, svc *orderservice.Service) transport {
	url := map[string]func(testing.TB) string{"nats": brokertest.NATS, "amqp": brokertest.AMQP}[broker](t)
	pubs := map[string]orderqueue.Publisher{}
	for _, action := range []string{orderqueue.ActionCreate, orderqueue.ActionCancel} {
		stream := brokertest.Name("MATRIX")
		topo := orderqueue.NamedTopology(stream, "test."+stream+"."+action, "matrix", brokertest.Name("matrix."+action))
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, orderqueue.EnsureTopology(ctx, url, topo))
		done := make(chan error, 1)
		go func() {
			done <- orderqueue.Run(ctx, svc, orderqueue.Options{Broker: url, Topology: topo, Action: action,
				RetryDelay: 100 * time.Millisecond})
		}()
		pub, err := orderqueue.Dial(url, topo)
		require.NoError(t, err)
		pubs[action] = pub
		t.Cleanup(func() {
			pub.Close()
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err, "the %s consumer ended", action)
			case <-time.After(time.Minute):
				t.Errorf("the %s consumer did not stop within a minute", action)
			}
			deleteTopology(t, url, topo)
		})
	}
	send := func(ctx context.Context, t *testing.T, action string, user int64, key string, body []byte) answer {
		t.Helper()
		reply, err := orderqueue.Request(ctx, pubs[action], orderqueue.Message{User: scopeOf(user), Key: key, Body: body})
		require.NoError(t, err)
		h := http.Header{}
		for k, v := range reply.Header {
			h.Set(k, v)
		}
		return httpAnswer(t, reply.Status, h, reply.Body)
	}
	return transport{
		name: broker,
		create: func(ctx context.Context, t *testing.T, user int64, key string, quantity int) answer {
			return send(ctx, t, orderqueue.ActionCreate, user, key, createBody(user, quantity))
		},
		cancel: func(ctx context.Context, t *testing.T, user int64, key, orderNo string) answer {
			return send(ctx, t, orderqueue.ActionCancel, user, key, fmt.Appendf(nil, `{"order_no":%q}`, orderNo))
		},
	}
}

func deleteTopology(t *testing.T, broker string, topo orderqueue.Topology) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := orderqueue.DeleteTopology(ctx, broker, topo); err != nil {
		t.Logf("delete the topology: %v", err)
	}
}
