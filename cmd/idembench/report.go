package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is everything a run writes.
type Report struct {
	Command    string         `json:"command"`
	Machine    Machine        `json:"machine"`
	Options    map[string]any `json:"options"`
	Elapsed    float64        `json:"elapsed_seconds"`
	Phases     []Phase        `json:"phases"`
	Points     []*Point       `json:"points"`
	B0         []*Point       `json:"b0_aggregated"` // per family and concurrency, all B0 runs merged
	B3         []*B3Result    `json:"b3"`
	B4Loads    []LoadTiming   `json:"b4_loads"`
	Ratios     []Ratio        `json:"ratios"`
	GoBench    []GoBench      `json:"go_benchmarks"`
	GoBenchCmd string         `json:"go_benchmarks_command"`
	Fiber      []string       `json:"fiber_semantic_differences"`
	Notes      []string       `json:"notes"`
	Failures   []string       `json:"correctness_failures"`
	Errors     []string       `json:"errors"`
	Cluster    *ClusterResult `json:"cluster,omitempty"`
	// Sources are the runs a merged report (-merge) was made of, newest
	// last, and Appendices the sections written by hand that it keeps
	// (merge.go).
	Sources    []Source   `json:"sources,omitempty"`
	Appendices []Appendix `json:"appendices,omitempty"`

	goBenchOut string
}

// Phase is how long one part of the run took.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Ratio is one derived number the report calls out.
type Ratio struct {
	Name        string  `json:"name"`
	Family      string  `json:"family"`
	Concurrency int     `json:"concurrency"`
	Value       float64 `json:"value"`
	Detail      string  `json:"detail"`
	Headline    bool    `json:"headline"`
}

const headlineConc = 16

// headlineFamilies are the families whose B1/B0 and B2/B0 P99 ratios are
// headlines, side by side, with their column titles.
var headlineFamilies = map[string]string{
	"mariadb": "MariaDB", "postgres": "PostgreSQL",
	"mariadb-grpc": "MariaDB over gRPC", "postgres-grpc": "PostgreSQL over gRPC",
}

// noisyCPU is the CPU (in % of one core) that other processes may use during
// a point before the report marks it noisy (†).
const noisyCPU = 25

func (rep *Report) fill(r *runner) {
	rep.Points = r.points
	rep.B3 = r.b3
	rep.B4Loads = r.b4loads
	rep.Notes = r.notes
	rep.Failures = r.failures
	rep.Fiber = fiberDifferences
	rep.B0 = aggregateB0(r.points)
	rep.Ratios = computeRatios(r.points, rep.B0)
	rep.Cluster = r.cluster
}

// aggregateB0 merges every B0 run of a family and concurrency into one row:
// the mean throughput and the percentiles of all their latencies.
func aggregateB0(points []*Point) []*Point {
	var out []*Point
	groups := map[string]*Point{}
	var lat = map[string][]time.Duration{}
	var runs = map[string]int{}
	for _, p := range points {
		if p.Bench != "B0" {
			continue
		}
		k := fmt.Sprintf("%s/%d", p.Family, p.Concurrency)
		g := groups[k]
		if g == nil {
			g = &Point{Family: p.Family, Bench: "B0", Concurrency: p.Concurrency, Statuses: map[string]int{}, Server: map[string]float64{}}
			groups[k] = g
			out = append(out, g)
		}
		runs[k]++
		g.Requests += p.Requests
		g.Errors += p.Errors
		g.Seconds += p.Seconds
		g.RPS += p.RPS
		for s, n := range p.Statuses {
			g.Statuses[s] += n
		}
		for s, v := range p.Server {
			g.Server[s] += v
		}
		lat[k] = append(lat[k], p.lat...)
	}
	for k, g := range groups {
		n := float64(runs[k])
		g.RPS /= n
		for s := range g.Server {
			g.Server[s] /= n
		}
		g.Variant = fmt.Sprintf("mean of %d runs", runs[k])
		l := lat[k]
		slices.Sort(l)
		fillLatency(g, l)
	}
	return out
}

func computeRatios(points []*Point, b0 []*Point) []Ratio {
	var out []Ratio
	for _, p := range points {
		switch {
		case p.Bench == "B1" && p.BaselineRPS > 0:
			out = append(out, Ratio{
				Name: "B1/B0 throughput, " + p.Variant, Family: p.Family, Concurrency: p.Concurrency,
				Value:    p.RPS / p.BaselineRPS,
				Detail:   fmt.Sprintf("%.0f / %.0f req/s", p.RPS, p.BaselineRPS),
				Headline: headlineFamilies[p.Family] != "" && p.Concurrency == headlineConc,
			})
		case p.Bench == "B2" && p.BaselineRPS > 0:
			out = append(out, Ratio{
				Name: "B2/B0 P99, " + p.Variant, Family: p.Family, Concurrency: p.Concurrency,
				Value:    p.P99 / p.BaselineP99,
				Detail:   fmt.Sprintf("%.2f / %.2f ms", p.P99, p.BaselineP99),
				Headline: headlineFamilies[p.Family] != "" && p.Concurrency == headlineConc,
			}, Ratio{
				Name: "B2/B0 throughput, " + p.Variant, Family: p.Family, Concurrency: p.Concurrency,
				Value:  p.RPS / p.BaselineRPS,
				Detail: fmt.Sprintf("%.0f / %.0f req/s", p.RPS, p.BaselineRPS),
			})
		case p.Bench == "SW" && p.BaselineRPS > 0:
			out = append(out, Ratio{
				Name: "sync-wait/no-sync-wait replay throughput (cache off, other node)", Family: p.Family, Concurrency: p.Concurrency,
				Value:  p.RPS / p.BaselineRPS,
				Detail: fmt.Sprintf("%.0f / %.0f req/s", p.RPS, p.BaselineRPS),
			}, Ratio{
				Name: "sync-wait/no-sync-wait replay P99 (cache off, other node)", Family: p.Family, Concurrency: p.Concurrency,
				Value:  p.P99 / p.BaselineP99,
				Detail: fmt.Sprintf("%.2f / %.2f ms", p.P99, p.BaselineP99),
			})
		case p.Bench == "B5" && p.BaselineRPS > 0:
			what := "B1 first request"
			if strings.Contains(p.Variant, "B2") {
				what = "B2 replay"
			}
			out = append(out, Ratio{
				Name: "ours/Fiber throughput, " + what, Family: "fiber", Concurrency: p.Concurrency,
				Value:    p.RPS / p.BaselineRPS,
				Detail:   fmt.Sprintf("%.0f / %.0f req/s", p.RPS, p.BaselineRPS),
				Headline: p.Concurrency == headlineConc,
			}, Ratio{
				Name: "ours/Fiber P99, " + what, Family: "fiber", Concurrency: p.Concurrency,
				Value:  p.P99 / p.BaselineP99,
				Detail: fmt.Sprintf("%.2f / %.2f ms", p.P99, p.BaselineP99),
			})
		}
	}
	// B4: the largest level against the empty one.
	var b4Labels []string
	for _, p := range points {
		if strings.HasPrefix(p.Bench, "B4:") && p.Bench != "B4:B0" && !slices.Contains(b4Labels, p.label()) {
			b4Labels = append(b4Labels, p.label())
		}
	}
	for _, label := range b4Labels {
		var empty, large *Point
		for _, p := range points {
			if p.label() != label {
				continue
			}
			if empty == nil || p.Records < empty.Records {
				empty = p
			}
			if large == nil || p.Records > large.Records {
				large = p
			}
		}
		if empty == nil || large == nil || empty == large {
			continue
		}
		name := strings.TrimPrefix(label, "B4:")
		lvl := fmt.Sprintf("%s/%s records", humanCount(large.Records), humanCount(empty.Records))
		normalized := large.BaselineRPS > 0 && empty.BaselineRPS > 0
		if normalized {
			// Levels are minutes apart: compare each through its own B0.
			out = append(out, Ratio{
				Name: "B4 " + name + " throughput " + lvl + " (each over its own B0)", Family: "mariadb", Concurrency: large.Concurrency,
				Value:  (large.RPS / large.BaselineRPS) / (empty.RPS / empty.BaselineRPS),
				Detail: fmt.Sprintf("(%.0f/%.0f) / (%.0f/%.0f) req/s", large.RPS, large.BaselineRPS, empty.RPS, empty.BaselineRPS), Headline: true,
			}, Ratio{
				Name: "B4 " + name + " P99 " + lvl + " (each over its own B0)", Family: "mariadb", Concurrency: large.Concurrency,
				Value:  (large.P99 / large.BaselineP99) / (empty.P99 / empty.BaselineP99),
				Detail: fmt.Sprintf("(%.2f/%.2f) / (%.2f/%.2f) ms", large.P99, large.BaselineP99, empty.P99, empty.BaselineP99), Headline: true,
			})
		}
		out = append(out, Ratio{
			Name: "B4 " + name + " throughput " + lvl + " (raw)", Family: "mariadb", Concurrency: large.Concurrency,
			Value:  large.RPS / empty.RPS,
			Detail: fmt.Sprintf("%.0f / %.0f req/s", large.RPS, empty.RPS), Headline: !normalized,
		}, Ratio{
			Name: "B4 " + name + " P99 " + lvl + " (raw)", Family: "mariadb", Concurrency: large.Concurrency,
			Value:  large.P99 / empty.P99,
			Detail: fmt.Sprintf("%.2f / %.2f ms", large.P99, empty.P99), Headline: !normalized,
		})
	}
	// B4: new keys of both kinds at each level (keys.go).
	out = append(out, keyKindRatios(points)...)
	return out
}

func (rep *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := rep.chart(filepath.Join(dir, "benchmarks.png")); err != nil {
		rep.Notes = append(rep.Notes, "chart: "+err.Error())
		fmt.Fprintln(os.Stderr, "idembench: chart:", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.md"), []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	return nil
}

func (rep *Report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	mode := "full"
	if q, _ := rep.Options["quick"].(bool); q {
		mode = "quick"
	}
	w("# Benchmarks\n\n")
	w("Generated by `cmd/idembench` (%s mode) — do not edit by hand; re-run it instead. ", mode)
	w("Timings are a report, never a test: they vary with the machine and with whatever else it runs.\n\n")
	w("Commands (from the repository root):\n\n```sh\n")
	w("cd cmd/idembench && go run . -quick -out ../../docs   # quick report, about two minutes (what CI runs)\n")
	w("cd cmd/idembench && go run . -out ../../docs          # full: concurrency 1/16/64, 10 s a point, B4 up to 10M records\n")
	w("cd cmd/idembench && go run . -mariadb=false -sqlite=false -b4=false -fiber=false -fleet=false -ceiling=false -gobench=false \\\n")
	w("    -merge -out ../../docs                            # only the families left on, merged into the report\n```\n\n")
	var phases []string
	for _, p := range rep.Phases {
		phases = append(phases, fmt.Sprintf("%s %.0f s", p.Name, p.Seconds))
	}
	if len(rep.Sources) > 1 {
		rep.sourcesMarkdown(&b)
	} else {
		w("This report: `%s` (%.0f s: %s). ", rep.Command, rep.Elapsed, strings.Join(phases, ", "))
	}
	w("`go run . -h` lists the flags (-mysql DSN, -postgres URL, -duration, -quick, -out, -sqlite, -modes, -merge, …).\n\n")
	m := rep.Machine
	w("## Machine\n\n| | |\n|---|---|\n")
	w("| date | %s |\n| nproc | %s |\n| CPU | %s |\n| memory | %s |\n| kernel | %s |\n| Go | %s (binary built with %s) |\n",
		m.Date, m.Nproc, m.CPUModel, m.MemTotal, m.Kernel, m.GoVersion, m.GoBuiltWith)
	w("| MariaDB | %s (`SELECT VERSION()`) |\n", m.MariaDB)
	var vars []string
	for k, v := range m.MariaDBVars {
		vars = append(vars, k+"="+v)
	}
	slices.Sort(vars)
	w("| MariaDB settings | %s |\n", strings.Join(vars, ", "))
	if m.Postgres != "" {
		var pv []string
		for k, v := range m.PostgresVars {
			pv = append(pv, k+"="+v)
		}
		slices.Sort(pv)
		w("| PostgreSQL | %s (`SHOW server_version`) |\n| PostgreSQL settings | %s |\n", m.Postgres, strings.Join(pv, ", "))
	}
	if m.Redis != "" {
		w("| Redis | %s |\n", m.Redis)
	}
	w("| SQLite | %s |\n\n", m.SQLiteDriver)
	w("Client, server and databases share these cores: the load generator, the HTTP server, the middleware and MariaDB compete for the same %s CPUs. ", m.Nproc)
	if m.MariaDBVars["innodb_flush_log_at_trx_commit"] == "1" {
		w("With innodb_flush_log_at_trx_commit=1 every commit waits for a redo-log flush (concurrent commits share one by group commit)")
		if m.PostgresVars["synchronous_commit"] == "on" && m.PostgresVars["fsync"] == "on" {
			w(", as every PostgreSQL commit waits for its WAL flush with synchronous_commit=on")
		}
		w("; SQLite runs in WAL mode with synchronous=NORMAL (sqlite.Open's setting), which does not flush at every commit, so its write numbers buy less durability than MariaDB's.")
	}
	w("\n\n")

	if len(rep.Failures) > 0 || len(rep.Errors) > 0 {
		w("## Failures\n\n")
		for _, f := range rep.Failures {
			w("- correctness: %s\n", f)
		}
		for _, e := range rep.Errors {
			w("- not measured: %s\n", e)
		}
		w("\n")
	}

	w("## Headline ratios (concurrency %d)\n\n", headlineConc)
	rep.headlines(&b)
	w("\nEvery ratio's denominator was measured alongside its numerator: each B1/B2 point and its own B0 baseline alternate in %v slices of the window (B0 first and last), so a slow spell of the machine falls on both; B4 and B5 points sit between runs of their reference. B1/B0 throughput below 1 is the middleware's cost on a create; B2/B0 P99 below 1 means a replay answers faster than executing the order.\n\n", rep.Options["slices"])

	w("## All ratios\n\n| family | c | ratio | value | from |\n|---|---:|---|---:|---|\n")
	for _, r := range rep.Ratios {
		w("| %s | %d | %s | %.2f | %s |\n", r.Family, r.Concurrency, r.Name, r.Value, r.Detail)
	}
	w("\n")

	rep.whereTimeGoes(&b)
	rep.postgresTimeGoes(&b)

	for _, fam := range []string{"mariadb", "postgres", "sqlite", "mariadb-grpc", "postgres-grpc"} {
		pts := rep.pointsOf(func(p *Point) bool { return p.Family == fam && (p.Bench == "B1" || p.Bench == "B2") })
		if len(pts) == 0 {
			continue
		}
		w("## B0–B2 on %s\n\n", map[string]string{"mariadb": "MariaDB", "postgres": "PostgreSQL", "sqlite": "SQLite",
			"mariadb-grpc": "MariaDB over gRPC", "postgres-grpc": "PostgreSQL over gRPC"}[fam])
		if strings.HasSuffix(fam, "-grpc") {
			w("The gRPC front-end (module grpc's interceptor, examples/grpcserver/ordergrpc) over the same database: B0 is CreateOrder without the interceptor in a plain transaction, B1 a new key per call through the interceptor, B2 a replay of a completed key (the replay cache on), each against B0 in alternating slices. Calls go over 4 HTTP/2 connections shared by the workers, as gRPC clients share them; every answer is checked (a replay marked idempotent-replayed and byte-identical, as a deterministic proto encoding, to the first). Targets (issue 23) at concurrency 16: single-phase B1/B0 ≥ 0.80, replay P99 ≤ 0.20 × B0's.\n\n")
		}
		rep.table(&b, fam, pts, true)
	}

	if len(rep.B3) > 0 {
		w("## B3: %d concurrent requests with one key\n\n", rep.B3[0].Requests)
		w("Time from releasing all requests (each on its own open connection) until the last answer; executions are purchase_order rows for the key, counted after every repetition (must be exactly 1).\n\n")
		w("| family | variant | reps | P50 ms | P99 ms | max ms | executions | answers (all reps) | exactly once |\n|---|---|---:|---:|---:|---:|---|---|---|\n")
		for _, r := range rep.B3 {
			var st []string
			for k, v := range r.Statuses {
				st = append(st, fmt.Sprintf("%s×%d", k, v))
			}
			slices.Sort(st)
			ok := "yes"
			if !r.OK {
				ok = "**NO**"
			}
			w("| %s | %s | %d | %.1f | %.1f | %.1f | %s | %s | %s |\n", r.Family, r.Variant, r.Reps, r.P50, r.P99, r.Max,
				compactInts(r.Executions), strings.Join(st, " "), ok)
		}
		w("\n")
	}

	if pts := rep.pointsOf(func(p *Point) bool { return strings.HasPrefix(p.Bench, "B4") }); len(pts) > 0 {
		w("## B4: existing idempotency records (MariaDB)\n\n")
		w("Existing records are DONE records with a 201 snapshot, spread over the benchmark's 16 scopes, with UUID-like keys spread evenly over the key space so new random keys land among them. B1 runs with random (UUIDv4) and with time-ordered (UUIDv7) new keys side by side, each through its own B0: new v7 keys all land at one point among the existing keys that moves only with the clock, as they would at the right edge of a table of older v7 keys. Only idempotency_record grows; purchase_order does not. B2 here runs with the replay cache off (the cache would hide the table) over a fresh pool of %v keys created at each level.\n\n", rep.Options["replay_pool"])
		w("| load | rows | seconds | rows/s | statements | idempotency_record after | write-back wait |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range rep.B4Loads {
			w("| %s → %s | %d | %.1f | %.0f | %d | %.0f MB | %.1f s |\n", humanCount(l.From), humanCount(l.To), l.To-l.From, l.Seconds, l.RowsPerSec, l.Statements, l.TableMB, l.SettleSeconds)
		}
		settleMax, _ := rep.Options["settle_max"].(string)
		w("\nAfter each load the run waits for InnoDB to write back the pages the load dirtied (until less than 1%% of the buffer pool is dirty, at most %s), so that little of the load's write-back runs under the next points; a wait as long as the limit means the limit ended it.\n", settleMax)
		w("\nLoader: INSERT … SELECT from a cross join of a ten-row digits CTE, ≤ 500k rows per statement in primary-key order (faster here than LOAD DATA LOCAL INFILE from a generated file: 3.5 s vs 4.0 s for 500k rows, before counting the file's generation).\n\n")
		rep.table(&b, "mariadb", pts, true)
	}

	if pts := rep.pointsOf(func(p *Point) bool { return p.Bench == "B5" }); len(pts) > 0 {
		w("## B5: Fiber v3 `middleware/idempotency` + Redis (peer)\n\n")
		w("A Fiber v3.1.0 app (fasthttp) whose POST /orders is orderservice's unprotected create handler through `middleware/adaptor`, behind `middleware/idempotency` with `gofiber/storage/redis/v3` v3.4.3 (KeyHeader Idempotency-Key). Ours is the net/http server with the middleware (claim-first, defaults) on the same database, measured between Fiber runs. Ratios are ours/Fiber.\n\n")
		rep.table(&b, "fiber", pts, false)
		w("What Fiber's middleware does not do, which the numbers do not show:\n\n")
		for _, d := range rep.Fiber {
			w("- %s\n", d)
		}
		w("\n")
	}

	rep.clusterMarkdown(&b)
	rep.fleetMarkdown(&b)
	rep.floorMarkdown(&b)
	rep.queueMarkdown(&b)
	rep.appendixMarkdown(&b)

	if len(rep.GoBench) > 0 {
		w("## In-process path: allocations per request\n\n")
		w("`%s` in the repository root (bench_test.go, fingerprint_test.go), run by idembench before the load points. ", rep.GoBenchCmd)
		w("`FakeStore` runs the real middleware over an in-memory idempotency.Store whose transactions come from a do-nothing database/sql driver, with a minimal handler that answers a fixed 201 — a fake used only in these benchmarks, so that they count the middleware's own work; `FakeStore/no-middleware` is the same handler in a plain transaction. ")
		w("`MariaDB` runs the example order service over the real MySQL store and a fresh database from internal/testdb (skipped without a server), through ServeHTTP without a network, so every allocation of middleware, store, driver and handler counts. Each iteration also builds its request from a template (a few allocations, in every variant).\n\n```\n")
		for _, g := range rep.GoBench {
			w("%s\n", g.Line)
		}
		w("```\n\n")
	}

	w("## Method\n\n")
	w("- Each point serves examples/orderservice in-process on 127.0.0.1:0 with net/http and drives POST /orders with N closed-loop workers (each sends its next request when the previous answer arrives) each over keep-alive connections of its own (since 2026-12-01: the worker writes each request and reads its answer on its own goroutine, where net/http's Transport handed every request to two goroutines per connection and back; families measured before then, whose command and date the report gives, used the Transport; B3 and the pools of keys B2 replays still do). Worker w is user w%%16+1 (X-User-ID, the key's scope); bodies cycle over the 100 catalog SKUs, quantity 1, no coupon.\n")
	w("- Every point warms up for %v, then measures for %v; only requests completing inside the window count. A B1/B2 point splits its window into %v slices that alternate with slices of its B0 baseline; %s, later slices for 200 ms (the connections are warm); the slices of each are merged. Latency is per request at the client; throughput is answers in the window / window.\n", rep.Options["warmup"], rep.Options["duration"], rep.Options["slices"], firstSliceWarmup(rep.Options))
	w("- Every answer is checked: 201 for creates; for replays also `Idempotent-Replayed: true` and a body byte-identical to the first answer. Failed checks are the `err` column; a point with more than 1%% fails the run.\n")
	w("- B0 is the same create transaction (price lookup, INSERT INTO purchase_order as INIT, guarded UPDATE to CREATED, commit) with Idempotency=false and no key. B1 sends a new UUID key per request. B2 replays a pool of %v completed keys round-robin.\n", rep.Options["replay_pool"])
	w("- Server columns (MariaDB): round trips/req are this process's statements to the database per request, BEGIN and COMMIT included, counted by a wrapper around the driver (each statement is one round trip with interpolateParams=true); fsync/req is `Innodb_data_fsyncs` per request (redo log and data files; group commit shares one log fsync between concurrent commits), reads/req is `Innodb_buffer_pool_reads` (pages read from disk). These two counters are server-wide: anything else running on the server adds to them. cpu%% is CPU time over the window in %% of one core: `go` is this process (load generator, HTTP server, middleware), `db` is mariadbd (and redis-server in B5), `other` is every other process on the machine (a busy neighbour makes that point noisy).\n")
	if len(rep.pointsOf(func(p *Point) bool { return p.Family == "postgres" })) > 0 {
		w("- Server columns (PostgreSQL): round trips/req as for MariaDB (pgx caches each connection's prepared statements, so after its first use a statement is one round trip); fsync/req is `pg_stat_wal.wal_sync` per request (server-wide, and flushed by the backends at most once a second, so it smears between neighbouring slices); reads/req is not measured; cpu%% db is the backends connected to the benchmark's database plus the WAL writer, checkpointer and background writer, read from /proc. The pool is postgres.Open's (postgres.MaxConns connections), as examples/server opens it.\n")
	}
	w("- Each family uses its own fresh database (idembench_<random>_<family>, dropped at the end) or a temporary SQLite file (WAL, the pool of 8 connections sqlite.Open sets up).\n\n")
	if len(rep.Notes) > 0 {
		w("## Notes\n\n")
		for _, n := range rep.Notes {
			w("- %s\n", n)
		}
		w("\n")
	}
	return b.String()
}

// headlines writes the headline ratios, MariaDB's and PostgreSQL's side by
// side, over HTTP and over gRPC (Fiber's and B4's run on MariaDB over
// HTTP), and whether each meets the targets of issues 12 and 23.
func (rep *Report) headlines(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	column := func(r Ratio) string {
		if headlineFamilies[r.Family] != "" {
			return r.Family
		}
		return "mariadb" // Fiber's and B4's
	}
	var cols, names []string
	cells := map[string]map[string]Ratio{}
	for _, r := range rep.Ratios {
		if !r.Headline {
			continue
		}
		if c := column(r); !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
		if cells[r.Name] == nil {
			cells[r.Name] = map[string]Ratio{}
			names = append(names, r.Name)
		}
		cells[r.Name][column(r)] = r
	}
	order := []string{"mariadb", "postgres", "mariadb-grpc", "postgres-grpc"}
	slices.SortFunc(cols, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	w("| ratio |")
	for _, c := range cols {
		w(" %s | from |", headlineFamilies[c])
	}
	w("\n|---|%s\n", strings.Repeat("---:|---|", len(cols)))
	for _, n := range names {
		w("| %s |", n)
		for _, c := range cols {
			if r, ok := cells[n][c]; ok {
				w(" **%.2f** | %s |", r.Value, r.Detail)
			} else {
				w(" | |")
			}
		}
		w("\n")
	}
	var verdicts []string
	for _, c := range cols {
		var bestMode string
		var best float64
		var replays []string
		met := true
		for _, r := range rep.Ratios {
			if !r.Headline || r.Family != c {
				continue
			}
			if mode, ok := strings.CutPrefix(r.Name, "B1/B0 throughput, "); ok && r.Value > best {
				bestMode, best = mode, r.Value
			}
			if v, ok := strings.CutPrefix(r.Name, "B2/B0 P99, "); ok && strings.HasSuffix(v, "cache on") {
				replays = append(replays, fmt.Sprintf("%.2f %s", r.Value, strings.TrimSuffix(v, ", cache on")))
				met = met && r.Value <= 0.2
			}
		}
		if bestMode == "" {
			continue
		}
		verdict := map[bool]string{true: "met", false: "missed"}
		v := fmt.Sprintf("%s: B1/B0 %.2f %s (%s)", headlineFamilies[c], best, bestMode, verdict[best >= 0.8])
		if len(replays) > 0 {
			v += fmt.Sprintf("; replay P99 %s (%s)", strings.Join(replays, ", "), verdict[met])
		}
		verdicts = append(verdicts, v)
	}
	if len(verdicts) > 0 {
		w("\nTargets (issues 12 and 23), at concurrency %d: the faster mode's B1/B0 throughput ≥ 0.80, and a replay's P99 with the replay cache (the default) ≤ 0.20 × the bare create's. %s.\n", headlineConc, strings.Join(verdicts, ". "))
	}
}

func (rep *Report) pointsOf(keep func(*Point) bool) []*Point {
	var out []*Point
	for _, p := range rep.Points {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// table writes points grouped by concurrency, with the aggregated B0 row of
// the family at that concurrency first when withB0.
func (rep *Report) table(b *strings.Builder, fam string, pts []*Point, withB0 bool) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("| c | scenario | records | req/s | P50 ms | P99 ms | P99.9 ms | vs baseline thr | vs baseline P99 | round trips/req | fsync/req | reads/req | cpu%% go | cpu%% db | cpu%% other | err |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	anyNoisy := false
	row := func(p *Point, name string) {
		thr, p99 := "", ""
		if p.BaselineRPS > 0 {
			thr = fmt.Sprintf("%.2f", p.RPS/p.BaselineRPS)
			p99 = fmt.Sprintf("%.2f", p.P99/p.BaselineP99)
		}
		s := func(k, f string) string {
			if v, ok := p.Server[k]; ok {
				return fmt.Sprintf(f, v)
			}
			return ""
		}
		rec := ""
		if strings.HasPrefix(p.Bench, "B4") {
			rec = humanCount(p.Records)
		}
		db := s("cpu_db", "%.0f")
		if r := s("cpu_redis", "%.0f"); r != "" {
			db += " + redis " + r
		}
		noisy := ""
		if p.Server["cpu_other"] > noisyCPU {
			noisy = " †"
			anyNoisy = true
		}
		w("| %d | %s | %s | %.0f%s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n",
			p.Concurrency, name, rec, p.RPS, noisy, p.P50, p.P99, p.P999, thr, p99,
			s("round_trips", "%.1f"), s("fsyncs", "%.2f"), s("bp_disk_reads", "%.2f"), s("cpu_self", "%.0f"), db, s("cpu_other", "%.0f"), p.Errors)
	}
	var concs []int
	for _, p := range pts {
		if !slices.Contains(concs, p.Concurrency) {
			concs = append(concs, p.Concurrency)
		}
	}
	for _, c := range concs {
		if withB0 {
			for _, g := range rep.B0 {
				if g.Family == fam && g.Concurrency == c && !strings.HasPrefix(pts[0].Bench, "B4") {
					row(g, "B0 ("+g.Variant+")")
				}
			}
		}
		for _, p := range pts {
			if p.Concurrency == c {
				row(p, p.label())
			}
		}
	}
	if anyNoisy {
		w("\n† other processes used more than %d%% of a core during this point (cpu%% other): treat it as noisy.\n", noisyCPU)
	}
	w("\n")
}

// whereTimeGoes writes the server counters and in-process costs side by side:
// what each path adds over the baseline.
func (rep *Report) whereTimeGoes(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	var b0 *Point
	for _, g := range rep.B0 {
		if g.Family == "mariadb" && (b0 == nil || g.Concurrency == headlineConc) {
			b0 = g
		}
	}
	if b0 == nil {
		return
	}
	c := b0.Concurrency
	var b1, b2 []*Point
	for _, p := range rep.Points {
		if p.Family == "mariadb" && p.Concurrency == c {
			switch p.Bench {
			case "B1":
				b1 = append(b1, p)
			case "B2":
				b2 = append(b2, p)
			}
		}
	}
	w("## Where the time goes\n\n")
	stat := func(p *Point) string {
		return fmt.Sprintf("%.1f round trips, %.2f fsyncs, CPU %.2f ms in this process + %.2f ms in mariadbd (%.0f%% + %.0f%% of a core, %.0f%% by others)",
			p.Server["round_trips"], p.Server["fsyncs"], p.Server["cpu_self_ms_per_req"], p.Server["cpu_db_ms_per_req"],
			p.Server["cpu_self"], p.Server["cpu_db"], p.Server["cpu_other"])
	}
	w("Per request at concurrency %d on MariaDB (round trips counted in this process; fsyncs and CPU as in Method):\n\n", c)
	w("- B0: %s.\n", stat(b0))
	for _, p := range b1 {
		w("- B1 %s: %s; %+.1f round trips over B0.\n", p.Variant, stat(p), p.Server["round_trips"]-b0.Server["round_trips"])
	}
	for _, p := range b2 {
		w("- B2 %s: %s.\n", p.Variant, stat(p))
	}
	for _, p := range rep.Points {
		if p.Bench == "ceiling" {
			w("- Harness ceiling, concurrency %d: the load generator and net/http alone (a handler that reads the body and answers a fixed 201, no database) reach %.0f req/s, P50 %.2f ms, P99 %.2f ms, using %.0f%% of a core: no point can beat this here; one near it is bound by the harness, not the middleware.\n",
				p.Concurrency, p.RPS, p.P50, p.P99, p.Server["cpu_self"])
		}
	}
	w("\nOn %s cores shared by the load generator, the server and MariaDB, CPU per request decides throughput once the cores are busy (go + mariadbd + others near %d%%); at concurrency 1 the latency of each round trip and flush does. ", rep.Machine.Nproc, 100*atoiOr(rep.Machine.Nproc, 2))
	w("Claim-first writes twice per create: the claim INSERT commits on its own (with innodb_flush_log_at_trx_commit=1, its own redo-log flush) before the business transaction, which then finishes the record with an UPDATE — changing the status, lease and expiry columns and so its secondary index entry — and commits. Single-phase INSERTs the finished record as the business transaction's last statement, so a create costs one statement more than B0, commits once, like B0, and writes each index entry once. ")
	w("A replay without the cache costs claim-first an INSERT that fails on the duplicate key plus a SELECT; single-phase executes the handler, collides on the order's (or the record's) unique key, rolls back and reads the record; with the cache it costs no statement at all. ")
	w("Group commit lets concurrent commits share one flush, so fsyncs per request fall below the commits per request as concurrency grows (the fsync counter is server-wide and also counts data-file flushes, so it is indicative only).\n\n")
	if b4 := rep.pointsOf(func(p *Point) bool { return p.Bench == "B4:B1" }); len(b4) > 1 {
		bp := rep.Machine.MariaDBVars["innodb_buffer_pool_size"]
		var bpMB float64
		fmt.Sscan(bp, &bpMB)
		w("B4: disk page reads per first request (reads/req) against existing records, with a %.0f MB buffer pool:", bpMB/1048576)
		for _, p := range b4 {
			mb := ""
			for _, l := range rep.B4Loads {
				if l.To == p.Records {
					mb = fmt.Sprintf(" (table %.0f MB)", l.TableMB)
				}
			}
			w(" %s, %s records%s → %.2f reads, %.0f req/s;", p.Variant, humanCount(p.Records), mb, p.Server["bp_disk_reads"], p.RPS)
		}
		w(" once the table outgrows the buffer pool, a new random key's primary-key leaf must come from disk, while a time-ordered key's is the leaf the previous insert used. Its one secondary index, (status, expires_at), grows at its right edge, which stays cached.\n\n")
	}
	gb := map[string]GoBench{}
	for _, g := range rep.GoBench {
		name := g.Name
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i]
		}
		gb[name] = g
	}
	if base, ok := gb["BenchmarkMiddleware_FirstRequest/FakeStore/no-middleware"]; ok {
		w("In process (Go benchmarks, FakeStore): ")
		for _, m := range []string{"claim-first", "single-phase"} {
			if g, ok := gb["BenchmarkMiddleware_FirstRequest/FakeStore/"+m]; ok {
				w("a first request in %s costs the middleware %+.1f µs, %+.0f B and %+.0f allocations over the bare handler in a transaction; ",
					m, (g.NsPerOp-base.NsPerOp)/1000, g.BytesPerOp-base.BytesPerOp, g.AllocsPerOp-base.AllocsPerOp)
			}
		}
		if g, ok := gb["BenchmarkMiddleware_Replay/FakeStore/cache-on"]; ok {
			w("a cached replay costs %.1f µs, %.0f B and %.0f allocations in all. ", g.NsPerOp/1000, g.BytesPerOp, g.AllocsPerOp)
		}
		w("Compared with a MariaDB round trip (a B0 create takes %.1f ms at P50 under load), the middleware's CPU work is small; its cost is the statements and the flush it adds.\n\n", b0.P50)
	}
}

func atoiOr(s string, def int) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
		return def
	}
	return n
}

// firstSliceWarmup says which first slices warmed up fully: all of them
// since the option was recorded; before, only B0's (B1/B2's warmed up for
// 200 ms, so a fresh replay cache could still be filling in their window).
func firstSliceWarmup(opts map[string]any) string {
	if opts["first_slice_warmup"] == "all" {
		return "the first slice of each side warms up for the full warm-up"
	}
	return "in this run only B0's first slice warmed up fully, B1/B2's for 200 ms (a fresh replay cache could still be filling during their first slice, which can only raise their P99)"
}
