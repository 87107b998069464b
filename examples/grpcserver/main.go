// Command grpcserver runs the example order API over gRPC, on the same
// orderservice and databases as examples/server:
//
//	go run ./examples/grpcserver                   # embedded SQLite, ./orders.db
//	go run ./examples/grpcserver -addr 127.0.0.1:9090 -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//	go run ./examples/grpcserver -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// Then, with grpcurl (it finds the API by reflection):
//
//	grpcurl -plaintext -H 'x-user-id: 7' -H 'idempotency-key: grpc-demo-1' \
//	  -d '{"user_id":7,"sku_id":20001,"quantity":1}' 127.0.0.1:9090 orders.v1.OrderService/CreateOrder
//
// Flags:
//
//	-addr HOST:PORT        listen address (default 127.0.0.1:9090)
//	-db URL                sqlite://PATH, mysql://DSN or postgres://… (default sqlite://orders.db)
//	-mode M                claim-first (default) or single-phase
//	-lease D               how long a PROCESSING claim is held (default 30s)
//	-retention D           how long a finished key is remembered (default 24h)
//	-in-flight-wait D      how long a duplicate waits for the original (default 0)
//	-reconcile-interval D  how often abandoned claims are settled (default 5s; 0 = off)
//	-purge-interval D      how often expired records are deleted (default 1m; 0 = off)
//	-handler-delay D       artificial delay inside the create transaction (default 0)
//
// It serves orders.v1.OrderService (orderpb/orders.proto), the gRPC health
// service and reflection. The HTTP example server and this one may share a
// database: a key used over one transport is the same action over the other.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/internal/dburl"
	"github.com/orderguard/idempotency/examples/orderservice"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "grpcserver:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("grpcserver", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9090", "listen address")
	dbURL := fs.String("db", "sqlite://orders.db", dburl.Usage)
	modeName := fs.String("mode", "claim-first", "recording mode: claim-first or single-phase")
	lease := fs.Duration("lease", 30*time.Second, "how long a PROCESSING claim is held")
	retention := fs.Duration("retention", 24*time.Hour, "how long a finished key is remembered")
	inFlightWait := fs.Duration("in-flight-wait", 0, "how long a duplicate waits for the original to finish")
	reconcile := fs.Duration("reconcile-interval", 5*time.Second, "how often abandoned claims are settled (0 = off)")
	purge := fs.Duration("purge-interval", time.Minute, "how often expired records are deleted (0 = off)")
	handlerDelay := fs.Duration("handler-delay", 0, "artificial delay inside the create transaction")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	mode, err := idempotency.ParseMode(*modeName)
	if err != nil {
		return fmt.Errorf("-mode: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, store, dialect, err := dburl.Open(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		return fmt.Errorf("setup %s: %w", dialect, err)
	}
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: true, Store: store, Dialect: dialect, HandlerDelay: *handlerDelay,
		Config: idempotency.Config{Mode: mode, Lease: *lease, Retention: *retention, InFlightWait: *inFlightWait, Logger: log},
	})
	if err != nil {
		return err
	}
	go orderservice.Maintenance{
		Store: store, Reconciler: orderservice.Reconciler(store, svc, *reconcile, *retention, log, nil),
		PurgeInterval: *purge, Logger: log,
	}.Run(ctx)

	srv, err := ordergrpc.New(svc)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("listening", "addr", lis.Addr().String(), "db", dialect, "mode", *modeName)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	return nil
}
