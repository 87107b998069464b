// Command agentsim simulates AI agents placing orders through a tool gateway
// that times out, and compares four duplicate-order guards in one run:
//
//	(a) no key, a new request id per attempt
//	(b) a client-generated order number as the only guard
//	(c) a short-TTL Redis SET NX lock keyed by user and intent
//	(d) this library: a stable key per intent, fingerprint and state machine
//
// Each strategy gets a fresh database and the order service on a real
// loopback listener behind a fault injector (slow orders past the gateway
// timeout), and the agents re-plan, retry and resume as in the incident.
// Duplicate and dirty orders are counted from the database. The Markdown
// table is printed and written to DIR/agentsim.md with a bar chart in
// DIR/agentsim.png.
//
//	go run ./examples/agentsim                    # full run, about 2-3 minutes on 2 cores
//	go run ./examples/agentsim -quick             # 500 actions per strategy
//	go run ./examples/agentsim -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//
// Flags (defaults in parentheses):
//
//	-actions N              business actions (user intents) per strategy (10000)
//	-quick                  500 actions per strategy, unless -actions is given
//	-concurrency N          conversations in flight at once (128)
//	-timeout-rate F         probability that a create request is slower than the gateway timeout (0.05)
//	-gateway-timeout D      the tool gateway's bound on one HTTP attempt (2s)
//	-order-latency D        latency of a slow create request, uniform in [1, 1.2]× (2.5s)
//	-base-latency D         mean latency of a normal create request, exponential (5ms)
//	-retry-rate F           probability that the runtime auto-retries a failed tool call; else the model re-plans (0.5)
//	-runtime-retries N      runtime retries of one tool call, when it retries (2)
//	-replan-delay D         the model's mean think time before a re-plan, uniform in [0.5, 1.5]× (1s)
//	-max-replans N          re-plans of one intent before the agent gives up (2)
//	-replan-coupon-rate F   probability that a re-plan switches the coupon (0.3)
//	-replan-orderno-rate F  probability that a re-plan regenerates the order number (0.5)
//	-resume-rate F          probability that a conversation resumes and re-submits its last call (0.02)
//	-coupon-rate F          fraction of intents that start with a coupon (0.04)
//	-lock-ttl D             TTL of strategy (c)'s lock (1s)
//	-redis ADDR             Redis of strategy (c); the row is skipped if unreachable (127.0.0.1:6379)
//	-db URL                 sqlite://DIR (default: a temp dir) or mysql://DSN; fresh database per strategy
//	-seed N                 seed of intents, agent choices and fault draws (1)
//	-strategies S           rows to run, letters of abcd (abcd)
//	-out DIR                where agentsim.md and agentsim.png go (docs); "" writes nothing
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/orderguard/idempotency/examples/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the help is printed
		}
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		os.Exit(1)
	}
}

// options are the command's flags beyond Config.
type options struct {
	Config
	quick bool
	out   string
}

// help is what -h prints: what the simulation needs running, and its flags.
var help = cli.Help{
	Usage: "go run ./examples/agentsim [flags]",
	About: "Simulates AI agents calling create_order through a gateway that times out, " +
		"under four strategies (no key; the client order number only; a Redis SET NX lock; a key per intent, this library), " +
		"and writes the duplicate and dirty orders each one lets through to docs/agentsim.md.",
	Needs: "nothing: the order API runs in-process on SQLite in a temporary directory. " +
		"MariaDB/MySQL only when -db names one; strategy (c) needs Redis at -redis and is skipped when nothing answers there.",
	Examples: []string{"go run ./examples/agentsim -quick", "go run ./examples/agentsim -db 'mysql://root@tcp(127.0.0.1:3306)/test'"},
	Groups: []cli.Group{
		cli.Flags("Run", "quick", "actions", "concurrency", "strategies", "seed", "out"),
		cli.Flags("Services", "db", "redis", "lock-ttl"),
		cli.Flags("Network and runtime", "gateway-timeout", "timeout-rate", "order-latency", "base-latency", "retry-rate", "runtime-retries"),
		cli.Flags("The model's re-plans", "replan-delay", "max-replans", "replan-coupon-rate", "replan-orderno-rate", "resume-rate", "coupon-rate"),
	},
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{Config: DefaultConfig()}
	c := &o.Config
	fs := flag.NewFlagSet("agentsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Actions, "actions", c.Actions, "business actions (user intents) per strategy")
	fs.BoolVar(&o.quick, "quick", false, fmt.Sprintf("%d actions per strategy, unless -actions is given", QuickActions))
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "conversations in flight at once")
	fs.Float64Var(&c.TimeoutRate, "timeout-rate", c.TimeoutRate, "probability that a create request is slower than the gateway timeout")
	fs.DurationVar(&c.GatewayTimeout, "gateway-timeout", c.GatewayTimeout, "the tool gateway's bound on one HTTP attempt")
	fs.DurationVar(&c.OrderLatency, "order-latency", c.OrderLatency, "latency of a slow create request (uniform in [1, 1.2] × this)")
	fs.DurationVar(&c.BaseLatency, "base-latency", c.BaseLatency, "mean latency of a normal create request (exponential)")
	fs.Float64Var(&c.RetryRate, "retry-rate", c.RetryRate, "probability that the runtime auto-retries a failed tool call (else the model re-plans)")
	fs.IntVar(&c.RuntimeRetries, "runtime-retries", c.RuntimeRetries, "runtime retries of one tool call, when it retries")
	fs.DurationVar(&c.ReplanDelay, "replan-delay", c.ReplanDelay, "the model's mean think time before a re-plan (uniform in [0.5, 1.5] × this)")
	fs.IntVar(&c.MaxReplans, "max-replans", c.MaxReplans, "re-plans of one intent before the agent gives up")
	fs.Float64Var(&c.ReplanCouponRate, "replan-coupon-rate", c.ReplanCouponRate, "probability that a re-plan switches the coupon")
	fs.Float64Var(&c.ReplanOrderNoRate, "replan-orderno-rate", c.ReplanOrderNoRate, "probability that a re-plan regenerates the client order number")
	fs.Float64Var(&c.ResumeRate, "resume-rate", c.ResumeRate, "probability that a conversation resumes and re-submits its last call")
	fs.Float64Var(&c.CouponRate, "coupon-rate", c.CouponRate, "fraction of intents that start with a coupon")
	fs.DurationVar(&c.LockTTL, "lock-ttl", c.LockTTL, "TTL of strategy (c)'s Redis lock")
	fs.StringVar(&c.Redis, "redis", c.Redis, "Redis address for strategy (c); skipped if unreachable")
	fs.StringVar(&c.DB, "db", "", "sqlite://DIR or mysql://DSN (default: sqlite:// in a temp dir); a fresh database per strategy")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of intents, agent choices and fault draws")
	fs.StringVar(&c.Strategies, "strategies", c.Strategies, "rows to run: letters of abcd")
	fs.StringVar(&o.out, "out", "docs", `directory for agentsim.md and agentsim.png ("" writes nothing)`)
	help.Install(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	actionsSet := false
	fs.Visit(func(f *flag.Flag) { actionsSet = actionsSet || f.Name == "actions" })
	if o.quick && !actionsSet {
		c.Actions = QuickActions
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	dbLabel := o.DB
	if o.DB == "" {
		dir, err := os.MkdirTemp("", "agentsim-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.DB = "sqlite://" + dir
		dbLabel = "sqlite://$TMPDIR/agentsim-*"
	}
	start := time.Now()
	results, err := Run(ctx, o.Config, stderr)
	if err != nil {
		return err
	}
	rep := Report{
		Command: strings.TrimSpace("go run ./examples/agentsim " + strings.Join(args, " ")),
		Config:  o.Config,
		DBLabel: dbLabel,
		Results: results,
		Date:    start,
		Elapsed: time.Since(start),
	}
	fmt.Fprint(stdout, Table(results))
	if o.out == "" {
		return nil
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "agentsim.md"), []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	if err := Chart(results, filepath.Join(o.out, "agentsim.png")); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	fmt.Fprintf(stderr, "wrote %s and %s\n", filepath.Join(o.out, "agentsim.md"), filepath.Join(o.out, "agentsim.png"))
	return nil
}
