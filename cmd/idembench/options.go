package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

type options struct {
	mysql         string
	redis         string
	duration      time.Duration
	warmup        time.Duration
	quick         bool
	out           string
	sqlite        bool
	fiber         bool
	fleet         bool
	grpc          bool
	floor         bool
	b4            bool
	ceiling       bool
	gobench       bool
	benchtime     string
	concurrency   []int
	modes         []idempotency.Mode
	b4Levels      []int64
	b4Conc        int
	b3Reps        int
	b3Conc        int
	poolSize      int
	slices        int
	settleMax     time.Duration
	maxErrorRate  float64
	profileDir    string
	mysqlBatch    bool
	mariadb       bool
	postgres      string
	merge         bool
	galeraDSNs    string
	clusterConc   int
	lookupN       int
	fromJSON      string
	queue         bool
	natsURL       string
	amqpURL       string
	queueMessages int
	queueWorkers  int
	queueBatch    int
	webhook       bool
	webhookEvents int
	webhookSend   int
	only          map[string]bool
	args          []string
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.StringVar(&o.mysql, "mysql", "root@tcp(127.0.0.1:3306)/", "MariaDB/MySQL server DSN (go-sql-driver form); a fresh database is created per scenario family and dropped at the end")
	fs.StringVar(&o.redis, "redis", "127.0.0.1:6379", "Redis address for B5 (Fiber) and the fleet family's Redis variants; they are skipped with a note if unreachable")
	fs.DurationVar(&o.duration, "duration", 0, "measurement window per point (default 10s, -quick 1.5s)")
	fs.DurationVar(&o.warmup, "warmup", 0, "warm-up per point before the window (default 1s, -quick 0.5s)")
	fs.BoolVar(&o.quick, "quick", false, "a run of about two minutes: concurrency 16 only, B2 in the first mode only, fewer B3 repetitions, B4 at 0 and 100k in the first mode with half windows, the fleet in the first mode at 20 % retries")
	fs.StringVar(&o.out, "out", "docs", "directory for benchmarks.md and benchmarks.json")
	fs.BoolVar(&o.sqlite, "sqlite", true, "include SQLite rows (default on in full mode, off with -quick unless given)")
	fs.BoolVar(&o.fiber, "fiber", true, "include B5, Fiber v3 + Redis")
	fs.BoolVar(&o.b4, "b4", true, "include B4, existing records")
	fs.BoolVar(&o.floor, "floor", true, "include the claim-floor family: claim-first's cost by statement at the database (database CPU and statements per request; claim only, finish, batched claims), against the bare create (default on in full mode, off with -quick unless given)")
	fs.BoolVar(&o.grpc, "grpc", true, "include the gRPC families: B0–B2 through the gRPC front-end on MariaDB and PostgreSQL")
	fs.BoolVar(&o.fleet, "fleet", true, "include the fleet family: three instances on one MariaDB database, random routing, 5 % and 20 % retries landing anywhere, without and with the Redis pre-filter (-redis), and Redis stopped mid-run (-quick: the first mode at 20 % only)")
	fs.BoolVar(&o.ceiling, "ceiling", true, "measure the harness ceiling (a no-op 201 handler, no database; default on in full mode, off with -quick unless given)")
	fs.BoolVar(&o.gobench, "gobench", true, "run the root package's Go benchmarks (-benchmem)")
	fs.StringVar(&o.benchtime, "benchtime", "", "-benchtime for the Go benchmarks (default go test's, -quick 100ms)")
	conc := fs.String("concurrency", "", "comma-separated concurrencies (default 1,16,64, -quick 16)")
	modes := fs.String("modes", "claim-first,single-phase", "comma-separated middleware modes for B1, B2 and B3")
	levels := fs.String("b4-levels", "", "comma-separated existing-record levels for B4 (default 0,1000000,10000000, -quick 0,100000)")
	fs.IntVar(&o.b4Conc, "b4-concurrency", 16, "concurrency of the B4 points")
	fs.IntVar(&o.b3Reps, "b3-reps", 0, "B3 repetitions per variant (default 20, -quick 5)")
	fs.IntVar(&o.b3Conc, "b3-requests", 64, "B3 concurrent requests with one key")
	fs.DurationVar(&o.settleMax, "settle", 0, "B4: longest wait after a load for InnoDB's write-back (default 3m, -quick 3s)")
	fs.IntVar(&o.slices, "slices", 0, "B1 and B2 points alternate with their B0 baseline in this many slices of the window each (default 5, -quick 3; 1 with -cpuprofile)")
	fs.IntVar(&o.poolSize, "pool", 0, "completed keys replayed round-robin in B2 (default 1000, -quick 256)")
	fs.BoolVar(&o.mysqlBatch, "mysql-batch", true, "open MariaDB pools on idempotency.OpenMySQL's connector, which sends single-phase's record with the COMMIT (false: the driver's own, as sql.Open; for a before/after)")
	fs.StringVar(&o.profileDir, "cpuprofile", "", "directory for a Go CPU profile of each load point (this process: load generator, server, middleware, driver)")
	fs.BoolVar(&o.mariadb, "mariadb", true, "include B0–B3 on MariaDB (-mysql)")
	fs.StringVar(&o.postgres, "postgres", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL server URL (a pgx connection string) for B0–B3 on PostgreSQL, also with -quick; a fresh database is created per run and dropped at the end; skipped with a note if unreachable, off when empty")
	fs.BoolVar(&o.merge, "merge", false, "merge into -out's benchmarks.json: replace the families measured in this run, keep the others (with the command and machine that measured them) and sections of benchmarks.md written by hand, and render benchmarks.md from the merged report")
	fs.StringVar(&o.galeraDSNs, "galera-dsns", "", "comma-separated DSNs of a Galera cluster's nodes (scripts/galera.sh dsns): runs the cluster family on nodes 1 and 2; skipped when empty, also with -quick")
	fs.IntVar(&o.clusterConc, "cluster-concurrency", 16, "concurrency of the cluster family's points")
	fs.IntVar(&o.lookupN, "cluster-lookups", 2000, "sequential Lookups per store in the cluster family's sync-wait micro-measure")
	fs.StringVar(&o.fromJSON, "from-json", "", "measure nothing: re-render benchmarks.md in -out from this benchmarks.json; with -merge, merge that run (written by an earlier run's -out) into -out's report, as if it had run with -merge")
	fs.Float64Var(&o.maxErrorRate, "max-error-rate", 0.01, "share of failed answers above which a point fails the run")
	fs.BoolVar(&o.queue, "queue", true, "include the queue family: the create consumed from NATS JetStream (-nats) and RabbitMQ (-amqp) over MariaDB, messages/s protected against unprotected, one by one and batched, and a redelivery storm (queue.go)")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server with JetStream for the queue family; skipped with a note if unreachable, off when empty")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL for the queue family; skipped with a note if unreachable, off when empty")
	fs.IntVar(&o.queueMessages, "queue-messages", 0, "messages per queue run (default 2000, -quick 300)")
	fs.IntVar(&o.queueWorkers, "queue-workers", 4, "the queue consumer's workers (queue.Config.Workers)")
	fs.IntVar(&o.queueBatch, "queue-batch", 32, "the batched queue variants' batch size (queue.Config.BatchSize)")
	fs.BoolVar(&o.webhook, "webhook", true, "include the webhook family: payment callbacks (Standard Webhooks) through the example's webhook front-end on MariaDB and PostgreSQL, events/s protected against the naive handler, and a redelivery storm counting double effects (webhook.go)")
	fs.IntVar(&o.webhookEvents, "webhook-events", 0, "events per webhook run (default 1000, -quick 200)")
	fs.IntVar(&o.webhookSend, "webhook-senders", 16, "the webhook family's concurrent senders")
	only := fs.String("only", "", "comma-separated families to run (mariadb, postgres, mariadb-grpc, postgres-grpc, sqlite, floor, fleet, b4, fiber, queue, webhook, galera, gobench, ceiling); the others are off whatever their flags say (with -merge, the others keep their earlier measurements)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, name := range strings.Split(*only, ",") {
			o.only[strings.TrimSpace(name)] = true
		}
		o.gobench = o.only["gobench"]
		o.ceiling = o.only["ceiling"]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.args = args
	// Settings left at zero take their full or quick default.
	defaultTo(&o.duration, 10*time.Second, 1500*time.Millisecond, o.quick)
	defaultTo(&o.warmup, time.Second, 500*time.Millisecond, o.quick)
	defaultTo(&o.settleMax, 3*time.Minute, 3*time.Second, o.quick)
	defaultTo(&o.slices, 5, 3, o.quick)
	defaultTo(&o.queueMessages, 2000, 300, o.quick)
	defaultTo(&o.webhookEvents, 1000, 200, o.quick)
	defaultTo(&o.b3Reps, 20, 5, o.quick)
	defaultTo(&o.poolSize, 1000, 256, o.quick)
	defaultTo(conc, "1,16,64", "16", o.quick)
	defaultTo(levels, "0,1000000,10000000", "0,100000", o.quick)
	if o.profileDir != "" {
		o.slices = 1 // one profile per point
	}
	// Quick mode leaves out what it was not asked for by name.
	for name, on := range map[string]*bool{"sqlite": &o.sqlite, "floor": &o.floor, "ceiling": &o.ceiling} {
		if o.quick && !set[name] {
			*on = false
		}
	}
	if o.benchtime == "" && o.quick {
		o.benchtime = "100ms"
	}
	for _, s := range strings.Split(*conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			return o, fmt.Errorf("-concurrency: bad value %q", s)
		}
		o.concurrency = append(o.concurrency, c)
	}
	for _, s := range strings.Split(*modes, ",") {
		m, err := parseMode(s)
		if err != nil {
			return o, fmt.Errorf("-modes: %w", err)
		}
		o.modes = append(o.modes, m)
	}
	if len(o.modes) == 0 || o.modes[0] != idempotency.ModeClaimFirst {
		return o, errors.New("-modes: list claim-first first (B2's pool and B4 use it)")
	}
	for _, s := range strings.Split(*levels, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 0 || n > 10*users*1_000_000 {
			return o, fmt.Errorf("-b4-levels: bad value %q", s)
		}
		if len(o.b4Levels) > 0 && n < o.b4Levels[len(o.b4Levels)-1] {
			return o, errors.New("-b4-levels: list levels in ascending order")
		}
		o.b4Levels = append(o.b4Levels, n)
	}
	return o, nil
}

// defaultTo sets *v, if zero, to full, or to quick in quick mode.
func defaultTo[T comparable](v *T, full, quick T, isQuick bool) {
	var zero T
	switch {
	case *v != zero:
	case isQuick:
		*v = quick
	default:
		*v = full
	}
}

func (o options) summary() map[string]any {
	modes := make([]string, len(o.modes))
	for i, m := range o.modes {
		modes[i] = modeName(m)
	}
	return map[string]any{
		"quick": o.quick, "mysql_batch": o.mysqlBatch, "duration": o.duration.String(), "warmup": o.warmup.String(), "slices": o.slices, "settle_max": o.settleMax.String(), "first_slice_warmup": "all", "round_trips": "network",
		"concurrency": o.concurrency, "modes": modes, "b4_levels": o.b4Levels, "b4_concurrency": o.b4Conc,
		"b3_requests": o.b3Conc, "b3_repetitions": o.b3Reps, "replay_pool": o.poolSize,
		"sqlite": o.sqlite, "fiber": o.fiber, "fleet": o.fleet, "grpc": o.grpc, "floor": o.floor, "ceiling": o.ceiling, "b4": o.b4, "gobench": o.gobench, "benchtime": o.benchtime,
		"mariadb": o.mariadb, "postgres": o.postgres != "", "galera": o.galeraDSNs != "", "cluster_concurrency": o.clusterConc, "cluster_lookups": o.lookupN,
		"only":  slices.Sorted(maps.Keys(o.only)),
		"queue": o.queue, "queue_messages": o.queueMessages, "queue_workers": o.queueWorkers, "queue_batch": o.queueBatch,
		"webhook": o.webhook, "webhook_events": o.webhookEvents, "webhook_senders": o.webhookSend,
	}
}
