// Package ordergrpc serves the example order API over gRPC: orderpb's
// OrderService over the same orderservice.Service as the HTTP example, with
// CreateOrder and CancelOrder protected by idemgrpc's interceptor and the
// service's own idempotency middleware, so that one key is one action
// whether it arrives over HTTP or gRPC.
//
// Metadata: x-user-id is the principal (a positive integer, as the HTTP
// header X-User-ID), idempotency-key the key. The server registers the gRPC
// health service (SERVING) and reflection, so grpcurl and any reflection
// client call it without the .proto.
package ordergrpc

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// Full method names of the protected calls.
const (
	CreateOrderMethod = "/orders.v1.OrderService/CreateOrder"
	CancelOrderMethod = "/orders.v1.OrderService/CancelOrder"
)

// UserMetadata carries the principal.
const UserMetadata = "x-user-id"

// New returns a gRPC server of svc's order API, with opts (credentials,
// limits) before its own interceptors. Without the service's idempotency
// (orderservice.Options.Idempotency false) every write runs unprotected in
// a plain transaction: the benchmarks' baseline.
func New(svc *orderservice.Service, opts ...grpc.ServerOption) (*grpc.Server, error) {
	interceptors := []grpc.UnaryServerInterceptor{authenticate, validateCreate}
	if create := svc.Middleware("create_order"); create != nil {
		idem, err := idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{
			// The HTTP routes' actions, declared once on their Middleware
			// (orderservice.CreateOperation, CancelOperation): the same
			// fields, routes and statuses.
			CreateOrderMethod: {Middleware: create, Scope: principalScope},
			CancelOrderMethod: {Middleware: svc.Middleware("cancel_order"), Scope: principalScope},
		})
		if err != nil {
			return nil, err
		}
		interceptors = append(interceptors, idem)
	}
	s := grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(interceptors...))...)
	orderpb.RegisterOrderServiceServer(s, &server{svc: svc, protected: svc.Middleware("create_order") != nil})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("orders.v1.OrderService", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	return s, nil
}

type principalKey struct{}

// authenticate requires x-user-id on the order API's calls: it stands in for
// an authenticated principal, parsed as the HTTP example parses X-User-ID.
func authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/orders.v1.OrderService/") {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(UserMetadata)
	var uid int64
	if len(values) == 1 {
		uid, _ = strconv.ParseInt(values[0], 10, 64)
	}
	if uid <= 0 {
		return nil, idemgrpc.ProblemStatus(idempotency.NewProblem(http.StatusUnauthorized,
			idempotency.ProblemScopeRequired, "Unauthenticated", "Send x-user-id: a positive integer.")).Err()
	}
	return handler(context.WithValue(ctx, principalKey{}, uid), req)
}

func principal(ctx context.Context) int64 {
	uid, _ := ctx.Value(principalKey{}).(int64)
	return uid
}

// principalScope is the protected calls' scope: the principal in canonical
// decimal, as the HTTP example's, so a key is the same user's over both.
func principalScope(ctx context.Context) (string, error) {
	uid := principal(ctx)
	if uid <= 0 {
		return "", errors.New("no principal")
	}
	return strconv.FormatInt(uid, 10), nil
}

// validateCreate refuses a malformed create before anything is claimed, as
// the HTTP example does: bad input writes nothing.
func validateCreate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == CreateOrderMethod {
		if p := orderservice.ValidateCreate(principal(ctx), createRequest(req.(*orderpb.CreateOrderRequest))); p != nil {
			return nil, idemgrpc.ProblemStatus(p).Err()
		}
	}
	return handler(ctx, req)
}

// server implements orderpb.OrderServiceServer over the orderservice.
type server struct {
	orderpb.UnimplementedOrderServiceServer
	svc       *orderservice.Service
	protected bool
}

// write runs op in the record's transaction under the interceptor, or in a
// plain one without idempotency, and answers its reply with the headers
// the HTTP route sends (a create's Location: /orders/{order_no}) as header
// metadata, which the interceptor records with the answer.
func (s *server) write(ctx context.Context, op func(tx *sql.Tx) orderservice.Reply) (*orderpb.Order, error) {
	if !s.protected {
		return answerWithHeader(ctx, s.svc.Unprotected(ctx, op))
	}
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "ordergrpc: no idempotent execution in the context")
	}
	return answerWithHeader(ctx, op(tx))
}

// answerWithHeader is answer, with a successful reply's headers set as
// header metadata (lower-case keys), as Reply.Write sets them over HTTP.
func answerWithHeader(ctx context.Context, r orderservice.Reply) (*orderpb.Order, error) {
	if r.Problem == nil && len(r.Header) > 0 {
		md := metadata.MD{}
		for k, v := range r.Header {
			md.Append(k, v...) // Append lower-cases the key
		}
		if err := grpc.SetHeader(ctx, md); err != nil {
			return nil, status.Errorf(codes.Internal, "ordergrpc: set the header metadata: %v", err)
		}
	}
	return answer(r)
}

func (s *server) CreateOrder(ctx context.Context, req *orderpb.CreateOrderRequest) (*orderpb.Order, error) {
	return s.write(ctx, func(tx *sql.Tx) orderservice.Reply {
		return s.svc.Create(ctx, tx, principal(ctx), createRequest(req))
	})
}

func (s *server) CancelOrder(ctx context.Context, req *orderpb.CancelOrderRequest) (*orderpb.Order, error) {
	return s.write(ctx, func(tx *sql.Tx) orderservice.Reply {
		return s.svc.Cancel(ctx, tx, principal(ctx), req.GetOrderNo())
	})
}

func (s *server) GetOrder(ctx context.Context, req *orderpb.GetOrderRequest) (*orderpb.Order, error) {
	return answer(s.svc.Get(ctx, principal(ctx), req.GetOrderNo()))
}

func createRequest(req *orderpb.CreateOrderRequest) orderservice.CreateRequest {
	return orderservice.CreateRequest{
		UserID: req.GetUserId(), SKUID: req.GetSkuId(), Quantity: int(req.GetQuantity()),
		CouponID: req.CouponId, OrderNo: req.GetOrderNo(),
	}
}

// answer is a Reply in gRPC's terms: the order, or its problem's status.
func answer(r orderservice.Reply) (*orderpb.Order, error) {
	if r.Problem != nil {
		return nil, idemgrpc.ProblemStatus(r.Problem).Err()
	}
	o := r.Order
	return &orderpb.Order{
		OrderNo: o.OrderNo, Status: o.Status, UserId: o.UserID, SkuId: o.SKUID, Quantity: int32(o.Quantity),
		CouponId: o.CouponID, UnitPriceCents: o.UnitPriceCents, DiscountCents: o.DiscountCents, TotalCents: o.TotalCents,
	}, nil
}
