// Command server runs the example order API with idempotent order creation.
//
//	go run ./examples/server                      # embedded SQLite, ./orders.db
//	go run ./examples/server -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//	go run ./examples/server -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// Its flags, grouped, and what it needs running: go run ./examples/server -h.
// Payment callback routes are served only when their flags are given; each
// verifies the provider's signature over the raw body, applies the event to
// the order once per event id, and answers as the provider expects (Stripe
// 200, Standard Webhooks and WeChat Pay 204, Alipay "success"); GET
// /orders/{order_no} shows the outcome (status, refunded_cents).
//
// GET /metrics serves the Prometheus metrics of package metrics, and
// GET /openapi.yaml the API's OpenAPI 3.1 description (docs/openapi.yaml).
//
// IDEMPOTENCY_CRASH_POINT=after-claim|in-handler|during-finalize|after-commit|during-release
// makes the server SIGKILL itself at that point of the first request that
// reaches it: the crash-safety tests use it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/docs"
	"github.com/orderguard/idempotency/examples/internal/cli"
	"github.com/orderguard/idempotency/examples/internal/dburl"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/metrics"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the help is printed
		}
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

type flags struct {
	addr              string
	db                string
	mode              string
	paymentMode       string
	reconcileInterval time.Duration
	purgeInterval     time.Duration
	lease             time.Duration
	retention         time.Duration
	inFlightWait      time.Duration
	handlerDelay      time.Duration
	idempotency       bool
	migrate           bool
	redis             string
	redisTimeout      time.Duration
	redisPrefix       string
	webhooks          webhookFlags
}

func parseFlags(args []string) (flags, error) { return parseFlagsTo(os.Stderr, args) }

// parseFlagsTo parses args; -h prints the help to out.
func parseFlagsTo(out io.Writer, args []string) (flags, error) {
	var f flags
	fs := newFlagSet(out, &f)
	return f, fs.Parse(args)
}

// newFlagSet returns the server's flags, bound to f, printing to out.
func newFlagSet(out io.Writer, f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "listen `HOST:PORT`")
	fs.StringVar(&f.db, "db", "sqlite://orders.db", dburl.Usage)
	fs.StringVar(&f.mode, "mode", "claim-first", "recording `MODE`: claim-first or single-phase")
	fs.StringVar(&f.paymentMode, "payment-mode", "single-phase", "recording `MODE` of payment events: single-phase (they write only in the database) or claim-first")
	fs.DurationVar(&f.reconcileInterval, "reconcile-interval", 5*time.Second, "how often abandoned claims are settled (0 = off)")
	fs.DurationVar(&f.purgeInterval, "purge-interval", time.Minute, "how often expired records are deleted (0 = off)")
	fs.DurationVar(&f.lease, "lease", 30*time.Second, "how long a PROCESSING claim is held")
	fs.DurationVar(&f.retention, "retention", 24*time.Hour, "how long a finished key is remembered (also one the reconciler finishes)")
	fs.DurationVar(&f.inFlightWait, "in-flight-wait", 0, "how long a duplicate waits for the original to finish")
	fs.DurationVar(&f.handlerDelay, "handler-delay", 0, "artificial delay inside the create transaction")
	fs.BoolVar(&f.idempotency, "idempotency", true, "protect writes with the idempotency middleware")
	fs.BoolVar(&f.migrate, "migrate", true, "apply the migrations and the order schema at start; false behind PgBouncer's transaction pooling, where they must run once on a direct connection")
	fs.StringVar(&f.redis, "redis", "", "Redis `ADDR` (host:port) of the shared replay pre-filter; empty: none")
	fs.StringVar(&f.redisPrefix, "redis-prefix", "orders:", "start of every Redis key written, so that services (or runs) sharing one Redis stay apart")
	fs.DurationVar(&f.redisTimeout, "redis-timeout", defaultRedisTimeout, "bound on one Redis call; a slower call is a miss and the request goes to the database")
	f.webhooks.register(fs)
	help.Install(fs)
	return fs
}

// help is what -h prints: what the server needs running, and every flag in
// its group (TestHelp_GroupsEveryFlag keeps it so).
var help = cli.Help{
	Usage: "go run ./examples/server [flags]",
	About: "The example order API (POST /orders, GET /orders/{order_no}, POST /orders/{order_no}/cancel, " +
		"POST /orders/{order_no}/pay) with idempotent order creation, its metrics at /metrics and its " +
		"OpenAPI description at /openapi.yaml.",
	Needs: "nothing: by default the orders are kept in the embedded SQLite file orders.db. " +
		"MariaDB/MySQL or PostgreSQL only when -db names one; Redis only with -redis.",
	Examples: []string{
		"go run ./examples/server",
		"go run ./examples/server -db 'mysql://root@tcp(127.0.0.1:3306)/test'",
		"go run ./examples/server -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' -mode single-phase",
	},
	Groups: []cli.Group{
		cli.Flags("Server", "addr"),
		cli.Flags("Database", "db", "migrate"),
		cli.Flags("Idempotency", "mode", "payment-mode", "lease", "retention", "in-flight-wait", "reconcile-interval", "purge-interval", "idempotency", "handler-delay"),
		cli.Flags("Redis pre-filter (optional)", "redis", "redis-timeout", "redis-prefix"),
		cli.Flags("Payment callbacks (each route served only when its flags are given)",
			"stripe-webhook-secret", "webhook-secret",
			"alipay-public-key", "alipay-app-id", "alipay-seller-id",
			"wechatpay-public-key", "wechatpay-serial", "wechatpay-apiv3-key", "webhook-tolerance"),
	},
}

func run(args []string) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	mode, err := idempotency.ParseMode(f.mode)
	if err != nil {
		return fmt.Errorf("-mode: %w", err)
	}
	paymentMode, err := idempotency.ParseMode(f.paymentMode)
	if err != nil {
		return fmt.Errorf("-payment-mode: %w", err)
	}
	hooks, err := f.webhooks.routes()
	if err != nil {
		return err
	}
	if len(hooks) > 0 && !f.idempotency {
		return errWebhooksNeedIdempotency
	}
	point, err := crashPoint()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Listening first: a port that is taken is said at once, naming -addr,
	// before the database is opened and migrated.
	ln, err := cli.Listen("addr", f.addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	db, store, dialect, err := dburl.Open(ctx, f.db)
	if err != nil {
		return err
	}
	defer db.Close()
	if f.migrate {
		if err := orderservice.Setup(ctx, db, dialect); err != nil {
			return fmt.Errorf("setup %s: %w", dialect, err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metricOpts := []metrics.Option{metrics.WithRoutes("create_order", "cancel_order", "pay_order")}
	if len(hooks) > 0 {
		metricOpts = append(metricOpts, metrics.WithRoutes(orderservice.PaymentEvents))
	}
	var shared idempotency.SharedCache
	if f.redis != "" && f.idempotency {
		cache, closeRedis, err := openRedis(ctx, f.redis, f.redisPrefix, f.redisTimeout, log)
		if err != nil {
			return err
		}
		defer closeRedis()
		shared = cache
		metricOpts = append(metricOpts, metrics.WithSharedCache("redis", cache))
	}
	obs, err := metrics.New(reg, metricOpts...)
	if err != nil {
		return err
	}
	if point != "" {
		store = crashingStore{Store: store, point: point}
		log.Warn("fault injection armed", "crash_point", point)
	}
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency:       f.idempotency,
		Store:             store,
		Dialect:           dialect,
		HandlerDelay:      f.handlerDelay,
		AfterCreate:       afterCreate(point),
		PaymentEventsMode: &paymentMode,
		Config: idempotency.Config{
			Mode:         mode,
			Lease:        f.lease,
			Retention:    f.retention,
			InFlightWait: f.inFlightWait,
			SharedCache:  shared,
			Logger:       log,
			Observer:     obs,
		},
	})
	if err != nil {
		return err
	}
	if f.idempotency {
		go orderservice.Maintenance{
			Store: store, Reconciler: newReconciler(f, log, store, svc, obs),
			PurgeInterval: f.purgeInterval, Logger: log, Observer: obs,
		}.Run(ctx)
	}

	mux := routes(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), svc)
	if err := mountWebhooks(mux, svc, hooks, log); err != nil {
		return err
	}
	srv := &http.Server{Handler: crashBeforeResponse(point, mux), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var webhooks []string
	for _, h := range hooks {
		webhooks = append(webhooks, h.pattern)
	}
	log.Info("listening", "addr", ln.Addr().String(), "db", dialect, "idempotency", f.idempotency, "mode", f.mode, "redis", f.redis, "webhooks", webhooks)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// routes is the server's mux: the metrics, the API's OpenAPI document, and
// the API itself for every other path.
func routes(metricsHandler, api http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler)
	mux.HandleFunc("GET /openapi.yaml", serveOpenAPI)
	mux.Handle("/", api)
	return mux
}

// serveOpenAPI answers the embedded docs/openapi.yaml, byte for byte.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(docs.OpenAPI)))
	_, _ = w.Write(docs.OpenAPI)
}

// newReconciler returns the task that settles claims left by crashed
// attempts (the seed's background task): an order that exists gets its
// snapshot back, a key whose order does not exist is released. It is nil
// when -reconcile-interval is 0. A backfilled record lives -retention like
// any other: without it the Reconciler's 24h default would apply, whatever
// the flag says.
func newReconciler(f flags, log *slog.Logger, store idempotency.Store, svc *orderservice.Service, obs idempotency.Observer) *idempotency.Reconciler {
	return orderservice.Reconciler(store, svc, f.reconcileInterval, f.retention, log, obs)
}
