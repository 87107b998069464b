package main

// Where the time goes: per-request server counters and CPU on MariaDB and
// PostgreSQL, side by side with the in-process costs.

import (
	"fmt"
	"strings"
)

// whereTimeGoes writes the server counters and in-process costs side by side:
// what each path adds over the baseline.
func (rep *Report) whereTimeGoes(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	b0 := rep.headlineB0("mariadb")
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
	w("Claim-first writes twice per create: the claim INSERT commits on its own (with innodb_flush_log_at_trx_commit=1, its own redo-log flush) before the business transaction, which then finishes the record with an UPDATE — changing the status, lease and expiry columns and so its secondary index entry — and commits. Single-phase INSERTs the finished record as the business transaction's last statement, so a create costs one statement more than B0%s, commits once, like B0, and writes each index entry once. ",
		map[bool]string{true: " (sent with the COMMIT, no round trip more)"}[rep.Options["round_trips"] == "network"])
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

// postgresTimeGoes writes the per-request costs on PostgreSQL at the
// headline concurrency: what each path adds over the bare create.
func (rep *Report) postgresTimeGoes(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	b0 := rep.headlineB0("postgres")
	if b0 == nil {
		return
	}
	stat := func(p *Point) string {
		return fmt.Sprintf("%.1f round trips, %.2f commits, %.2f WAL syncs, CPU %.2f ms in this process + %.2f ms in PostgreSQL (%.0f%% + %.0f%% of a core, %.0f%% by others)",
			p.Server["round_trips"], p.Server["commits"], p.Server["fsyncs"], p.Server["cpu_self_ms_per_req"], p.Server["cpu_db_ms_per_req"],
			p.Server["cpu_self"], p.Server["cpu_db"], p.Server["cpu_other"])
	}
	w("## Where the time goes on PostgreSQL\n\n")
	w("Per request at concurrency %d on PostgreSQL (round trips and commits counted in this process; WAL syncs are `pg_stat_wal.wal_sync`, server-wide; CPU in PostgreSQL is the backends of the benchmark's database plus the WAL writer, checkpointer and background writer):\n\n", b0.Concurrency)
	w("- B0: %s.\n", stat(b0))
	for _, p := range rep.Points {
		if p.Family != "postgres" || p.Concurrency != b0.Concurrency || (p.Bench != "B1" && p.Bench != "B2") {
			continue
		}
		extra := ""
		if p.Bench == "B1" {
			extra = fmt.Sprintf("; %+.1f round trips, %+.2f ms of PostgreSQL CPU over B0", p.Server["round_trips"]-b0.Server["round_trips"],
				p.Server["cpu_db_ms_per_req"]-b0.Server["cpu_db_ms_per_req"])
		}
		w("- %s: %s%s.\n", p.label(), stat(p), extra)
	}
	w("\nWith synchronous_commit=on a commit waits for its WAL flush, as with innodb_flush_log_at_trx_commit=1 on MariaDB; concurrent commits share flushes. PostgreSQL backends flush their statistics at most once a second, so WAL syncs per request smear between neighbouring slices: indicative only.\n\n")
}

// headlineB0 is family fam's aggregated B0 at the headline concurrency, or
// else its first; nil if it has none.
func (rep *Report) headlineB0(fam string) *Point {
	var b0 *Point
	for _, g := range rep.B0 {
		if g.Family == fam && (b0 == nil || g.Concurrency == headlineConc) {
			b0 = g
		}
	}
	return b0
}
