package ordergrpc_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/frontendtest"
	idemgrpc "github.com/orderguard/idempotency/grpc"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// The gRPC front-end passes the conformance suite on MariaDB and
// PostgreSQL.
func TestFrontend_GRPC(t *testing.T) {
	t.Parallel()
	for _, db := range []frontendtest.Database{frontendtest.MySQL, pgtest.Database} {
		frontendtest.Exercise(t, db, func(t *testing.T, env *frontendtest.Env) frontendtest.Frontend {
			client, _ := serve(t, env)
			return grpcFrontend{client: client}
		})
	}
}

// serve serves env's service over gRPC on loopback, with opts before the
// server's own, and returns a client and the address.
func serve(t *testing.T, env *frontendtest.Env, opts ...grpc.ServerOption) (orderpb.OrderServiceClient, string) {
	t.Helper()
	srv, err := ordergrpc.New(env.Service, opts...)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return orderpb.NewOrderServiceClient(conn), lis.Addr().String()
}

// grpcFrontend is the suite's client over gRPC: x-user-id and
// idempotency-key in the metadata, the answer's status read as the HTTP
// contract's (idemgrpc.ContractAnswer).
type grpcFrontend struct{ client orderpb.OrderServiceClient }

func (f grpcFrontend) Create(ctx context.Context, r frontendtest.Request) frontendtest.Answer {
	md := metadata.Pairs(ordergrpc.UserMetadata, strconv.FormatInt(r.User, 10))
	if r.Key != "" {
		md.Set(idemgrpc.MetadataKey, r.Key)
	}
	req := &orderpb.CreateOrderRequest{UserId: r.User, SkuId: r.SKU, Quantity: int32(r.Quantity), CouponId: r.Coupon}
	if r.Oversize {
		req.OrderNo = strings.Repeat("x", 2<<20)
	}
	var header metadata.MD
	order, err := f.client.CreateOrder(metadata.NewOutgoingContext(ctx, md), req, grpc.Header(&header))
	replayed := len(header.Get(idemgrpc.ReplayedKey)) == 1 && header.Get(idemgrpc.ReplayedKey)[0] == "true"
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			return frontendtest.Answer{Err: err}
		}
		code, kind, wait := idemgrpc.ContractAnswer(st)
		raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(st.Proto())
		return frontendtest.Answer{Status: code, Kind: kind, RetryAfter: wait > 0, Replayed: replayed, Raw: fmt.Sprintf("%x", raw)}
	}
	raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(order)
	return frontendtest.Answer{Status: 201, Replayed: replayed, OrderNo: order.GetOrderNo(), Raw: fmt.Sprintf("OK %x", raw)}
}
