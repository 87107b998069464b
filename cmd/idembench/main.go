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
//	webhook payment callbacks (Standard Webhooks) through the example's
//	    webhook front-end on MariaDB and PostgreSQL: events/s protected
//	    against the naive handler, and a redelivery storm counting double
//	    effects (webhook.go)
//
// plus allocations per request from the root package's Go benchmarks.
//
// Every family shares one runner (runner.go: a load window, a point against
// its baseline in alternating slices, fixed runs between baselines) and one
// report (report.go, report_md.go), and is one file: its run, and its
// section of benchmarks.md. The steps of a run are listed in order in
// steps (main.go).
//
// Run from the repository root:
//
//	cd cmd/idembench && go run . -quick -out ../../docs   # about 2 min, as CI does
//	cd cmd/idembench && go run . -out ../../docs          # full: 1/16/64, ~10 s a point, B4 to 10M
//	cd cmd/idembench && go run . -only postgres,postgres-grpc -merge -out ../../docs   # some families, merged
//
// It writes benchmarks.md and benchmarks.json to -out; with
// -merge, the families it measured replace theirs in -out's benchmarks.json
// and the rest is kept (merge.go). It exits 0 when the measurements
// complete, whatever the timings; non-zero if a correctness check failed
// (B3 executions other than exactly 1, answers failing their check, a
// protected webhook event applied twice) or a
// measurement could not be made.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts, err := parseOptions(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
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
	for _, st := range r.steps(ctx, rep) {
		if !st.on || (opts.only != nil && !opts.only[st.only]) || ctx.Err() != nil {
			continue
		}
		t0 := time.Now()
		err := st.run()
		rep.Phases = append(rep.Phases, Phase{Name: st.phase, Seconds: time.Since(t0).Seconds()})
		fmt.Fprintf(os.Stderr, "  (%s: %.1f s)\n", st.phase, time.Since(t0).Seconds())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", st.phase, err))
			fmt.Fprintf(os.Stderr, "idembench: %s: %v\n", st.phase, err)
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}

	rep.fill(r)
	rep.Elapsed = time.Since(start).Seconds()
	for _, err := range errs {
		rep.Errors = append(rep.Errors, err.Error())
	}
	if err := rep.save(opts.out, opts.merge); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	fmt.Print(rep.markdown())
	fmt.Fprintf(os.Stderr, "idembench: done in %.1f s; wrote %s\n", rep.Elapsed,
		strings.Join([]string{filepath.Join(opts.out, "benchmarks.md"), filepath.Join(opts.out, "benchmarks.json")}, ", "))
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

// step is one part of a run: a family's measurements, or the Go
// benchmarks. only is its name in -only, phase its phase's and its part's
// of the report (merge.go).
type step struct {
	only, phase string
	on          bool
	run         func() error
}

// steps are the parts of a run in the order a full run makes them, each
// family over a database opened for it alone. The Go benchmarks come first:
// their compile and run must not overlap a load point.
func (r *runner) steps(ctx context.Context, rep *Report) []step {
	o := r.opts
	// on runs fn over the database open opens, and closes it.
	on := func(open func() (*family, error), fn func(context.Context, *family) error) func() error {
		return func() error {
			f, err := open()
			if err != nil {
				return err
			}
			defer f.close()
			return fn(ctx, f)
		}
	}
	maria := func(label string) func() (*family, error) {
		return func() (*family, error) { return openMariaDB(ctx, o.mysql, label, !o.mysqlBatch) }
	}
	pg := func(label string) func() (*family, error) {
		return func() (*family, error) { return openPostgres(ctx, o.postgres, label) }
	}
	sqlite := func() (*family, error) { return openSQLite(ctx) }
	pgUp := false
	if o.postgres != "" {
		if err := pingPostgres(ctx, o.postgres); err != nil {
			r.note("postgres family skipped: %v", err)
		} else {
			pgUp = true
		}
	}
	goBench := func() (err error) {
		rep.GoBench, rep.GoBenchCmd, rep.goBenchOut, err = runGoBench(ctx, o.benchtime, o.mysql)
		return err
	}
	webhook := func() error {
		if err := on(maria("webhook"), r.runWebhook)(); err != nil || !pgUp {
			return err
		}
		return on(pg("webhook"), r.runWebhook)()
	}
	return []step{
		{"gobench", "go benchmarks", o.gobench, goBench},
		{"ceiling", "harness ceiling", o.ceiling, func() error { return r.runCeiling(ctx) }},
		{"mariadb", "mariadb", o.mariadb, on(maria("main"), r.runOrders)},
		{"postgres", "postgres", pgUp, on(pg("main"), r.runOrders)},
		{"mariadb-grpc", "mariadb-grpc", o.grpc && o.mysql != "", on(maria("grpc"), r.runGRPC)},
		{"postgres-grpc", "postgres-grpc", o.grpc && pgUp, on(pg("grpc"), r.runGRPC)},
		{"sqlite", "sqlite", o.sqlite, on(sqlite, r.runOrders)},
		{"floor", "floor", o.floor, on(maria("floor"), r.runFloor)},
		{"fleet", "fleet", o.fleet, on(maria("fleet"), r.runFleet)},
		{"b4", "b4", o.b4, on(maria("b4"), r.runB4)},
		{"fiber", "fiber", o.fiber, on(maria("fiber"), r.runFiber)},
		{"queue", famQueue, o.queue, on(maria("queue"), r.runQueue)},
		{"webhook", famWebhook, o.webhook, webhook},
		{"galera", "galera", o.galeraDSNs != "", func() error { return r.runCluster(ctx) }},
	}
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
	if merge && len(rep.Sources) > 0 {
		fmt.Fprintln(os.Stderr, "idembench: -from-json -merge:", path, "is a merged report; merge the runs it was made of")
		return 2
	}
	if err := rep.save(out, merge); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	return 0
}

// save writes the report to out, merged into the report there first with
// merge.
func (rep *Report) save(out string, merge bool) error {
	if merge {
		if err := rep.mergeInto(out); err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
	}
	if err := rep.write(out); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
