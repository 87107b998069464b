package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	"github.com/orderguard/idempotency/examples/internal/cli"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// callHelp is what call -h prints.
var callHelp = cli.Help{
	Usage: "go run ./examples/grpcserver call [flags] BODY",
	About: "Calls orders.v1.OrderService/CreateOrder once, with BODY (the JSON of CreateOrderRequest, as POST /orders takes it) " +
		"under one idempotency key, retried with that key while the answer is retryable, and prints the answer's header " +
		"metadata and the order as JSON; a refusal prints its gRPC code and message and exits 1. No grpcurl needed.",
	Needs: "the gRPC server at -addr (go run ./examples/grpcserver, in another terminal).",
	Examples: []string{
		`go run ./examples/grpcserver call -user 7 -key grpc-demo-1 '{"user_id":7,"sku_id":20001,"quantity":1}'`,
	},
	Groups: []cli.Group{cli.Flags("Call", "addr", "user", "key", "timeout")},
}

// call is the call subcommand: one CreateOrder, as a client of this
// library makes it (idemgrpc.UnaryClientInterceptor: one key, reused on
// every retry).
func call(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("grpcserver call", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9090", "the gRPC server's `HOST:PORT`")
	user := fs.String("user", "", "the caller, sent as x-user-id")
	key := fs.String("key", "", "the action's Idempotency-Key (idempotency-key); empty: one made for this call")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on the call, its retries included")
	callHelp.Install(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("call: want one BODY argument, the JSON of CreateOrderRequest")
	}
	var req orderpb.CreateOrderRequest
	if err := protojson.Unmarshal([]byte(fs.Arg(0)), &req); err != nil {
		return fmt.Errorf("call: BODY: %w", err)
	}
	conn, err := grpc.NewClient(*addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(client.Policy{MaxElapsed: *timeout})))
	if err != nil {
		return fmt.Errorf("-addr %s: %w", *addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, ordergrpc.UserMetadata, *user)
	if *key != "" {
		ctx = idemgrpc.WithKey(ctx, *key)
	}
	var header metadata.MD
	order, err := orderpb.NewOrderServiceClient(conn).CreateOrder(ctx, &req, grpc.Header(&header))
	if err != nil {
		s := status.Convert(err)
		fmt.Fprintf(stdout, "%s: %s\n", s.Code(), s.Message())
		return errCallRefused
	}
	names := make([]string, 0, len(header))
	for k := range header {
		if k == idemgrpc.ReplayedKey || k == "location" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(stdout, "%s: %s\n", k, header.Get(k)[0])
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(order)
	if err != nil {
		return err
	}
	// protojson varies its spacing from build to build on purpose; the
	// compact form is the same every time.
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "\n%s\n", compact.Bytes())
	return err
}

// errCallRefused is the exit status of a call the server refused: what it
// said is printed.
var errCallRefused = errors.New("the call was refused")
