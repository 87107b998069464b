package idemgrpc_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/client"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// A gRPC server whose CreateOrder is the same action as the HTTP route
// POST /orders: the Middleware is the route's, so a key used over HTTP and
// retried over gRPC is replayed, never run twice. The method's handler
// (your generated service's CreateOrder) does every write in
// idempotency.TxFromContext(ctx) and never commits it.
// examples/grpcserver is a complete server.
func ExampleNewServerInterceptor() {
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Operation: &idempotency.Operation{
			Name: "create_order", Route: "POST /orders", Status: http.StatusCreated,
			Fields: []string{"user_id", "sku_id", "quantity"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{
		"/orders.v1.OrderService/CreateOrder": {
			Middleware: mw,
			// The authenticated principal, as the HTTP route's ScopeFunc
			// spells it.
			Scope: func(ctx context.Context) (string, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				if v := md.Get("x-user-id"); len(v) == 1 {
					return v[0], nil
				}
				return "", fmt.Errorf("no x-user-id")
			},
		},
	})
	if err != nil {
		log.Fatal(err) // a method that is not unary, or not registered
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idem))
	// orderpb.RegisterOrderServiceServer(srv, orders): the generated code of
	// the service that declares CreateOrder.
	lis, err := net.Listen("tcp", "127.0.0.1:9090")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(lis))
}

// The client interceptor sends every attempt of one call under one key and
// retries only what the contract calls retryable, here an UNAVAILABLE
// answer. In a service it is a dial option:
// grpc.NewClient(addr, grpc.WithUnaryInterceptor(interceptor)); here it is
// called with an invoker that stands for the connection.
func ExampleUnaryClientInterceptor() {
	interceptor := idemgrpc.UnaryClientInterceptor(client.Policy{InitialDelay: time.Millisecond})
	attempts := 0
	invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		attempts++
		md, _ := metadata.FromOutgoingContext(ctx)
		fmt.Println("attempt", attempts, "idempotency-key", md.Get("idempotency-key"))
		if attempts == 1 {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	ctx := idemgrpc.WithKey(context.Background(), client.KeyFor("run-7f3a91c4", "call-1"))
	err := interceptor(ctx, "/orders.v1.OrderService/CreateOrder", nil, nil, nil, invoker)
	fmt.Println("err:", err)
	// Output:
	// attempt 1 idempotency-key [ik1-93f4038aa1f48f68823f9037c901cd58d00f25d961df6b174cb3b64d3eab680d]
	// attempt 2 idempotency-key [ik1-93f4038aa1f48f68823f9037c901cd58d00f25d961df6b174cb3b64d3eab680d]
	// err: <nil>
}
