package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// The gRPC family measures the gRPC front-end (module grpc's interceptor,
// served by examples/grpcserver/ordergrpc) over a family's database, side by
// side with the bare gRPC create, as B0–B2 measure net/http: B0 is
// CreateOrder without the interceptor in a plain transaction, B1 a new key
// per call through the interceptor in each mode, B2 a replay of a completed
// key with the replay cache on. Its points are the family's name with
// "-grpc".

// grpcRequests[user][sku] is the create message of bodies[user][sku].
var grpcRequests = func() [][]*orderpb.CreateOrderRequest {
	out := make([][]*orderpb.CreateOrderRequest, users+1)
	for u := 1; u <= users; u++ {
		out[u] = make([]*orderpb.CreateOrderRequest, numSKUs)
		for s := range numSKUs {
			out[u][s] = &orderpb.CreateOrderRequest{UserId: int64(u), SkuId: int64(firstSKU + s), Quantity: 1}
		}
	}
	return out
}()

// runGRPC measures the gRPC family over f.
func (r *runner) runGRPC(ctx context.Context, f *family) error {
	fam := f.name + "-grpc"
	fmt.Fprintf(os.Stderr, "== %s: B0 bare gRPC create, B1 first call, B2 replay\n", fam)
	return r.measureB0B2(fam, nil, f.probe, f.grpcTarget, r.opts.modes[:1], []bool{true})
}

// grpcTarget serves the order service with opts over gRPC until the family
// closes and returns a target whose requests are CreateOrder calls.
func (f *family) grpcTarget(opts orderservice.Options, gen generator, replays bool) (target, error) {
	svc, err := f.newService(opts)
	if err != nil {
		return target{}, err
	}
	srv, err := ordergrpc.New(svc)
	if err != nil {
		return target{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return target{}, err
	}
	go func() { _ = srv.Serve(ln) }()
	f.cleanup = append(f.cleanup, srv.Stop)
	// A few HTTP/2 connections, the calls of several workers multiplexed
	// on each, as gRPC clients share them.
	conns := make([]orderpb.OrderServiceClient, 4)
	for i := range conns {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return target{}, err
		}
		f.cleanup = append(f.cleanup, func() { conn.Close() })
		conns[i] = orderpb.NewOrderServiceClient(conn)
	}
	marshal := proto.MarshalOptions{Deterministic: true}
	call := func(w *worker, rq request) (int, bool, error) {
		md := metadata.Pairs(ordergrpc.UserMetadata, strconv.Itoa(rq.user))
		if rq.key != "" {
			md.Set(idemgrpc.MetadataKey, rq.key)
		}
		var header metadata.MD
		order, err := conns[w.id%len(conns)].CreateOrder(metadata.NewOutgoingContext(context.Background(), md),
			grpcRequests[rq.user][rq.sku], grpc.Header(&header))
		w.buf.Reset()
		if err != nil {
			st, ok := status.FromError(err)
			if !ok {
				return 0, false, err
			}
			code, _, _ := idemgrpc.ContractAnswer(st)
			return code, false, fmt.Errorf("%s: %s", st.Code(), st.Message())
		}
		b, err := marshal.Marshal(order)
		if err != nil {
			return 0, false, err
		}
		w.buf.Write(b)
		replayed := len(header.Get(idemgrpc.ReplayedKey)) == 1 && header.Get(idemgrpc.ReplayedKey)[0] == "true"
		return http.StatusCreated, replayed, nil
	}
	return target{call: call, gen: gen, wantStatus: http.StatusCreated, wantReplayed: replays}, nil
}
