// Command idembench measures the idempotency middleware end to end: the
// example order service's handlers served in-process by a real net/http
// server on loopback, over a real MariaDB, PostgreSQL and SQLite, driven by
// a closed-loop load generator.
//
//	B0  the create-order transaction without idempotency (the baseline)
//	B1  a first request (new key) through the middleware, in each mode
//	B2  a replay of a completed key, replay cache on and off
//	B3  64 concurrent requests with one key: time to answer all; exactly one
//	    execution, counted in purchase_order (the run fails otherwise)
//	B4  B1 and B2 with 0 .. 10M existing idempotency records; B1 with random
//	    (UUIDv4) and time-ordered (UUIDv7) new keys side by side (keys.go)
//	B5  the same workload through Fiber v3's idempotency middleware + Redis
//	fleet three instances on one database, new keys and retries landing on
//	    any instance, without and with the Redis pre-filter, and Redis
//	    stopped mid-run (fleet.go, fleet_redis.go)
//	grpc the same B0–B2 through the gRPC front-end (module grpc) on MariaDB
//	    and PostgreSQL (grpc.go)
//	galera (only with -galera-dsns) B1/B2 over B0 with two instances on two
//	    nodes of a Galera cluster vs one instance on one node, and the cost
//	    of the wsrep_sync_wait=1 prefix on Lookup (cluster.go)
//	queue the create consumed from NATS JetStream and RabbitMQ: messages/s
//	    protected against unprotected, one by one and batched, and a
//	    redelivery storm (queue.go)
//
// plus allocations per request from the root package's Go benchmarks.
//
// Run from the repository root:
//
//	cd cmd/idembench && go run . -quick -out ../../docs   # about 2 min, as CI does
//	cd cmd/idembench && go run . -out ../../docs          # full: 1/16/64, ~10 s a point, B4 to 10M
//	cd cmd/idembench && go run . -only postgres,postgres-grpc -merge -out ../../docs   # some families, merged
//
// It writes benchmarks.md, benchmarks.json and benchmarks.png to -out; with
// -merge, the families it measured replace theirs in -out's benchmarks.json
// and the rest is kept (merge.go). It exits 0 when the measurements
// complete, whatever the timings; non-zero if a correctness check failed
// (B3 executions other than exactly 1, answers failing their check) or a
// measurement could not be made.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
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
	fs.StringVar(&o.out, "out", "docs", "directory for benchmarks.md, benchmarks.json and benchmarks.png")
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
	fs.StringVar(&o.profileDir, "cpuprofile", "", "directory for a Go CPU profile of each load point (this process: load generator, server, middleware, driver)")
	fs.BoolVar(&o.mariadb, "mariadb", true, "include B0–B3 on MariaDB (-mysql)")
	fs.StringVar(&o.postgres, "postgres", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL server URL (a pgx connection string) for B0–B3 on PostgreSQL, also with -quick; a fresh database is created per run and dropped at the end; skipped with a note if unreachable, off when empty")
	fs.BoolVar(&o.merge, "merge", false, "merge into -out's benchmarks.json: replace the families measured in this run, keep the others (with the command and machine that measured them) and sections of benchmarks.md written by hand, and render benchmarks.md and benchmarks.png from the merged report")
	fs.StringVar(&o.galeraDSNs, "galera-dsns", "", "comma-separated DSNs of a Galera cluster's nodes (scripts/galera.sh dsns): runs the cluster family on nodes 1 and 2; skipped when empty, also with -quick")
	fs.IntVar(&o.clusterConc, "cluster-concurrency", 16, "concurrency of the cluster family's points")
	fs.IntVar(&o.lookupN, "cluster-lookups", 2000, "sequential Lookups per store in the cluster family's sync-wait micro-measure")
	fs.StringVar(&o.fromJSON, "from-json", "", "measure nothing: re-render benchmarks.md and benchmarks.png in -out from this benchmarks.json; with -merge, merge that run (written by an earlier run's -out) into -out's report, as if it had run with -merge")
	fs.Float64Var(&o.maxErrorRate, "max-error-rate", 0.01, "share of failed answers above which a point fails the run")
	fs.BoolVar(&o.queue, "queue", true, "include the queue family: the create consumed from NATS JetStream (-nats) and RabbitMQ (-amqp) over MariaDB, messages/s protected against unprotected, one by one and batched, and a redelivery storm (queue.go)")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server with JetStream for the queue family; skipped with a note if unreachable, off when empty")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL for the queue family; skipped with a note if unreachable, off when empty")
	fs.IntVar(&o.queueMessages, "queue-messages", 0, "messages per queue run (default 2000, -quick 300)")
	fs.IntVar(&o.queueWorkers, "queue-workers", 4, "the queue consumer's workers (queue.Config.Workers)")
	fs.IntVar(&o.queueBatch, "queue-batch", 32, "the batched queue variants' batch size (queue.Config.BatchSize)")
	only := fs.String("only", "", "comma-separated families to run (mariadb, postgres, mariadb-grpc, postgres-grpc, sqlite, floor, fleet, b4, fiber, queue, galera, gobench, ceiling); the others are off whatever their flags say (with -merge, the others keep their earlier measurements)")
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
	pick := func(full, quick string) string {
		if o.quick {
			return quick
		}
		return full
	}
	if o.duration == 0 {
		o.duration, _ = time.ParseDuration(pick("10s", "1500ms"))
	}
	if o.warmup == 0 {
		o.warmup, _ = time.ParseDuration(pick("1s", "500ms"))
	}
	if o.settleMax == 0 {
		o.settleMax, _ = time.ParseDuration(pick("3m", "3s"))
	}
	if o.slices == 0 {
		o.slices, _ = strconv.Atoi(pick("5", "3"))
	}
	if o.profileDir != "" {
		o.slices = 1 // one profile per point
	}
	if o.quick && !set["sqlite"] {
		o.sqlite = false
	}
	if o.quick && !set["floor"] {
		o.floor = false
	}
	if o.quick && !set["ceiling"] {
		o.ceiling = false
	}
	if o.benchtime == "" && o.quick {
		o.benchtime = "100ms"
	}
	if o.queueMessages == 0 {
		o.queueMessages, _ = strconv.Atoi(pick("2000", "300"))
	}
	if o.b3Reps == 0 {
		o.b3Reps, _ = strconv.Atoi(pick("20", "5"))
	}
	if o.poolSize == 0 {
		o.poolSize, _ = strconv.Atoi(pick("1000", "256"))
	}
	if *conc == "" {
		*conc = pick("1,16,64", "16")
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
	if *levels == "" {
		*levels = pick("0,1000000,10000000", "0,100000")
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

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts, err := parseOptions(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 2
	}
	if opts.fromJSON != "" {
		return rerender(opts.fromJSON, opts.out, opts.merge)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	r := &runner{opts: opts}
	rep := &Report{Command: commandLine(args), Options: opts.summary()}
	rep.Machine = describeMachine(ctx, opts.mysql, opts.redis)
	if opts.postgres != "" {
		rep.Machine.Postgres, rep.Machine.PostgresVars = describePostgres(ctx, opts.postgres)
	}
	fmt.Fprintf(os.Stderr, "idembench: %s\n  %s, %s cores, MariaDB %s, %s\n", rep.Command, rep.Machine.CPUModel, rep.Machine.Nproc, rep.Machine.MariaDB, rep.Machine.GoVersion)

	var errs []error
	step := func(name string, fn func() error) {
		if ctx.Err() != nil {
			return
		}
		t0 := time.Now()
		err := fn()
		rep.Phases = append(rep.Phases, Phase{Name: name, Seconds: time.Since(t0).Seconds()})
		fmt.Fprintf(os.Stderr, "  (%s: %.1f s)\n", name, time.Since(t0).Seconds())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			fmt.Fprintf(os.Stderr, "idembench: %s: %v\n", name, err)
		}
	}

	// Go benchmarks first: their compile and run must not overlap a load point.
	if opts.gobench {
		step("go benchmarks", func() error {
			var err error
			rep.GoBench, rep.GoBenchCmd, rep.goBenchOut, err = runGoBench(ctx, opts.benchtime, opts.mysql)
			return err
		})
	}
	if opts.ceiling {
		step("harness ceiling", func() error { return r.runCeiling(ctx) })
	}
	// onFamily runs fn over a family opened for it, and closes the family.
	onFamily := func(name string, open func() (*family, error), fn func(*family) error) {
		if opts.only != nil && !opts.only[name] {
			return
		}
		step(name, func() error {
			f, err := open()
			if err != nil {
				return err
			}
			defer f.close()
			return fn(f)
		})
	}
	maria := func(label string) func() (*family, error) {
		return func() (*family, error) { return openMariaDB(ctx, opts.mysql, label) }
	}
	mainAndB3 := func(f *family) error {
		if err := r.runMain(ctx, f); err != nil {
			return err
		}
		return r.runB3(ctx, f)
	}
	if opts.mariadb {
		onFamily("mariadb", maria("main"), mainAndB3)
	}
	if opts.postgres != "" {
		if err := pingPostgres(ctx, opts.postgres); err != nil {
			r.note("postgres family skipped: %v", err)
		} else {
			onFamily("postgres", func() (*family, error) { return openPostgres(ctx, opts.postgres, "main") }, mainAndB3)
		}
	}
	if opts.grpc && opts.mysql != "" {
		onFamily("mariadb-grpc", maria("grpc"), func(f *family) error { return r.runGRPC(ctx, f) })
	}
	if opts.grpc && opts.postgres != "" && pingPostgres(ctx, opts.postgres) == nil {
		onFamily("postgres-grpc", func() (*family, error) { return openPostgres(ctx, opts.postgres, "grpc") }, func(f *family) error { return r.runGRPC(ctx, f) })
	}
	if opts.sqlite {
		onFamily("sqlite", func() (*family, error) { return openSQLite(ctx) }, mainAndB3)
	}
	if opts.floor {
		onFamily("floor", maria("floor"), func(f *family) error { return r.runFloor(ctx, f) })
	}
	if opts.fleet {
		onFamily("fleet", maria("fleet"), func(f *family) error { return r.runFleet(ctx, f) })
	}
	if opts.b4 {
		onFamily("b4", maria("b4"), func(f *family) error { return r.runB4(ctx, f) })
	}
	if opts.fiber {
		onFamily("fiber", maria("fiber"), func(f *family) error { return r.runFiber(ctx, f) })
	}
	if opts.queue {
		onFamily("queue", maria("queue"), func(f *family) error { return r.runQueue(ctx, f) })
	}
	if opts.galeraDSNs != "" && (opts.only == nil || opts.only["galera"]) {
		step("galera", func() error { return r.runCluster(ctx) })
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}

	rep.fill(r)
	rep.Elapsed = time.Since(start).Seconds()
	for _, err := range errs {
		rep.Errors = append(rep.Errors, err.Error())
	}
	if opts.merge {
		if err := rep.mergeInto(opts.out); err != nil {
			fmt.Fprintln(os.Stderr, "idembench: -merge:", err)
			return 1
		}
	}
	if err := rep.write(opts.out); err != nil {
		fmt.Fprintln(os.Stderr, "idembench: write report:", err)
		return 1
	}
	fmt.Print(rep.markdown())
	fmt.Fprintf(os.Stderr, "idembench: done in %.1f s; wrote %s\n", rep.Elapsed,
		strings.Join([]string{filepath.Join(opts.out, "benchmarks.md"), filepath.Join(opts.out, "benchmarks.json"), filepath.Join(opts.out, "benchmarks.png")}, ", "))
	switch {
	case len(r.failures) > 0:
		fmt.Fprintf(os.Stderr, "idembench: %d correctness check(s) FAILED:\n  %s\n", len(r.failures), strings.Join(r.failures, "\n  "))
		return 3
	case len(errs) > 0:
		fmt.Fprintf(os.Stderr, "idembench: %d measurement(s) could not be made\n", len(errs))
		return 1
	}
	return 0
}

func commandLine(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " ()'\"$*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		quoted[i] = a
	}
	return strings.TrimSpace("cd cmd/idembench && go run . " + strings.Join(quoted, " "))
}

func (o options) summary() map[string]any {
	modes := make([]string, len(o.modes))
	for i, m := range o.modes {
		modes[i] = modeName(m)
	}
	return map[string]any{
		"quick": o.quick, "duration": o.duration.String(), "warmup": o.warmup.String(), "slices": o.slices, "settle_max": o.settleMax.String(), "first_slice_warmup": "all",
		"concurrency": o.concurrency, "modes": modes, "b4_levels": o.b4Levels, "b4_concurrency": o.b4Conc,
		"b3_requests": o.b3Conc, "b3_repetitions": o.b3Reps, "replay_pool": o.poolSize,
		"sqlite": o.sqlite, "fiber": o.fiber, "fleet": o.fleet, "grpc": o.grpc, "floor": o.floor, "ceiling": o.ceiling, "b4": o.b4, "gobench": o.gobench, "benchtime": o.benchtime,
		"mariadb": o.mariadb, "postgres": o.postgres != "", "galera": o.galeraDSNs != "", "cluster_concurrency": o.clusterConc, "cluster_lookups": o.lookupN,
		"only":  slices.Sorted(maps.Keys(o.only)),
		"queue": o.queue, "queue_messages": o.queueMessages, "queue_workers": o.queueWorkers, "queue_batch": o.queueBatch,
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// rerender writes the report of an earlier run again, from its JSON.
func rerender(path, out string, merge bool) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", path+":", err)
		return 1
	}
	if merge {
		if len(rep.Sources) > 0 {
			fmt.Fprintln(os.Stderr, "idembench: -from-json -merge:", path, "is a merged report; merge the runs it was made of")
			return 2
		}
		if err := rep.mergeInto(out); err != nil {
			fmt.Fprintln(os.Stderr, "idembench: -merge:", err)
			return 1
		}
	}
	if err := rep.write(out); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	return 0
}
