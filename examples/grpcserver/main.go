// Command grpcserver runs the example order API over gRPC, on the same
// orderservice and databases as examples/server:
//
//	go run ./examples/grpcserver                   # embedded SQLite, ./orders.db
//	go run ./examples/grpcserver -addr 127.0.0.1:9090 -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//	go run ./examples/grpcserver -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// Then, with its own client (one key, reused on every retry):
//
//	go run ./examples/grpcserver call -user 7 -key grpc-demo-1 '{"user_id":7,"sku_id":20001,"quantity":1}'
//
// or with grpcurl (it finds the API by reflection):
//
//	grpcurl -plaintext -H 'x-user-id: 7' -H 'idempotency-key: grpc-demo-1' \
//	  -d '{"user_id":7,"sku_id":20001,"quantity":1}' 127.0.0.1:9090 orders.v1.OrderService/CreateOrder
//
// Its flags, grouped, and what it needs running: go run ./examples/grpcserver -h.
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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/internal/cli"
	"github.com/orderguard/idempotency/examples/internal/dburl"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// help is what -h prints: what the server needs running, and every flag in
// its group (TestHelp_GroupsEveryFlag keeps it so).
var help = cli.Help{
	Usage: "go run ./examples/grpcserver [flags]",
	About: "The example order API over gRPC (orders.v1.OrderService, with health and reflection), " +
		"on the same order service and databases as examples/server: a key used over one is the same action over the other.",
	Needs: "nothing: by default the orders are kept in the embedded SQLite file orders.db. " +
		"MariaDB/MySQL or PostgreSQL only when -db names one.",
	Examples: []string{
		"go run ./examples/grpcserver",
		"go run ./examples/grpcserver -db 'mysql://root@tcp(127.0.0.1:3306)/test'",
	},
	Groups: []cli.Group{
		cli.Flags("Server", "addr"),
		cli.Flags("Database", "db"),
		cli.Flags("Idempotency", "mode", "lease", "retention", "in-flight-wait", "reconcile-interval", "purge-interval", "handler-delay"),
	},
}

func main() {
	var err error
	if args := os.Args[1:]; len(args) > 0 && args[0] == "call" {
		err = call(args[1:], os.Stdout)
	} else {
		err = run(args)
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errCallRefused):
		os.Exit(1) // what the server said is printed
	default:
		fmt.Fprintln(os.Stderr, "grpcserver:", err)
		os.Exit(1)
	}
}

// options are the server's flags.
type options struct {
	addr, dbURL, modeName                                          string
	lease, retention, inFlightWait, reconcile, purge, handlerDelay time.Duration
}

// newFlagSet returns the server's flags, bound to o.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("grpcserver", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:9090", "listen `HOST:PORT`")
	fs.StringVar(&o.dbURL, "db", "sqlite://orders.db", dburl.Usage)
	fs.StringVar(&o.modeName, "mode", "claim-first", "recording `MODE`: claim-first or single-phase")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "how long a PROCESSING claim is held")
	fs.DurationVar(&o.retention, "retention", 24*time.Hour, "how long a finished key is remembered")
	fs.DurationVar(&o.inFlightWait, "in-flight-wait", 0, "how long a duplicate waits for the original to finish")
	fs.DurationVar(&o.reconcile, "reconcile-interval", 5*time.Second, "how often abandoned claims are settled (0 = off)")
	fs.DurationVar(&o.purge, "purge-interval", time.Minute, "how often expired records are deleted (0 = off)")
	fs.DurationVar(&o.handlerDelay, "handler-delay", 0, "artificial delay inside the create transaction")
	help.Install(fs)
	return fs
}

func run(args []string) error {
	var o options
	if err := newFlagSet(&o).Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	mode, err := idempotency.ParseMode(o.modeName)
	if err != nil {
		return fmt.Errorf("-mode: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Listening first: a port that is taken is said at once, naming -addr,
	// before the database is opened and migrated.
	lis, err := cli.Listen("addr", o.addr)
	if err != nil {
		return err
	}
	defer lis.Close()
	db, store, dialect, err := dburl.Open(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		return fmt.Errorf("setup %s: %w", dialect, err)
	}
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: true, Store: store, Dialect: dialect, HandlerDelay: o.handlerDelay,
		Config: idempotency.Config{Mode: mode, Lease: o.lease, Retention: o.retention, InFlightWait: o.inFlightWait, Logger: log},
	})
	if err != nil {
		return err
	}
	go orderservice.Maintenance{
		Store: store, Reconciler: orderservice.Reconciler(store, svc, o.reconcile, o.retention, log, nil),
		PurgeInterval: o.purge, Logger: log,
	}.Run(ctx)

	srv, err := ordergrpc.New(svc)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("listening", "addr", lis.Addr().String(), "db", dialect, "mode", o.modeName)
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
