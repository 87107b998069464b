package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

// LoadTiming is one bulk load of existing idempotency records (B4).
type LoadTiming struct {
	From       int64   `json:"from_records"`
	To         int64   `json:"to_records"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_second"`
	Statements int     `json:"statements"`
	TableMB    float64 `json:"table_mb"` // data+index of idempotency_record after the load
	// SettleSeconds is the wait after the load for InnoDB's write-back of
	// the pages it dirtied (below 1% of the buffer pool, at most -settle).
	SettleSeconds float64 `json:"settle_seconds"`
}

// loadBatch is the most rows one INSERT ... SELECT writes.
const loadBatch = 500_000

// bulkLoad adds count DONE records (each with a realistic 201 snapshot) to
// idempotency_record, spread evenly over the benchmark's scopes ("1".."16").
// Rows are generated on the server by INSERT ... SELECT from a cross join of
// a ten-row digits CTE (no data crosses the wire), at most loadBatch rows per
// statement, each batch in ascending primary-key order. Keys look like the
// load generator's UUIDs — lowercase hex, the first 8 digits spread evenly
// over the whole range — so that new random keys land uniformly among the
// existing ones, as they would in production, instead of all after them.
// New time-ordered keys (UUIDv7, "019…" today) all land at one point among
// them, which moves only with the clock: as at the right edge of a table of
// older v7 keys, the pages there stay cached and every insert goes next to
// the last one. (Existing v7-shaped keys would be no fairer: random keys
// would then mostly land after them all.)
// tag (0..4095) keeps each load's keys distinct from earlier loads'.
// Expired records (for the purge points) were created two days ago and
// expired an hour ago, so Purge deletes them and nothing else.
//
// Measured on this machine for 500k rows: this took 3.5 s; LOAD DATA LOCAL
// INFILE of the same rows from a generated 220 MB file took 4.0 s without
// counting the file's generation, so the generator runs on the server.
func bulkLoad(ctx context.Context, db *sql.DB, count int64, tag int, expired bool) (int, error) {
	if count <= 0 {
		return 0, nil
	}
	perScope := count / users
	statements := 0
	times := "NOW(6), NOW(6), NOW(6) + INTERVAL 1 DAY"
	if expired {
		times = "NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 1 HOUR"
	}
	for u := 1; u <= users; u++ {
		n := perScope
		if u == users {
			n = count - perScope*(users-1)
		}
		for from := int64(0); from < n; from += loadBatch {
			to := min(from+loadBatch, n)
			q := fmt.Sprintf(`INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version, locked_until,
   response_status, response_headers, response_body, created_at, updated_at, expires_at)
WITH d AS (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
           UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
     s AS (SELECT %[7]s AS i FROM %[8]s)
SELECT '%[1]d',
  CONCAT(LOWER(LPAD(HEX(FLOOR(j * 4294967296 / %[4]d)), 8, '0')), '-%[5]s-4000-8000-', LOWER(LPAD(HEX(j), 12, '0'))),
  LOWER(LPAD(HEX(j), 64, '0')), 'DONE', 'idembench-bulk/0000000000000000', 2, NULL, 201,
  CONCAT('{"Content-Type":["application/json"],"Location":["/orders/B%[5]s', j, '"]}'),
  CONCAT('{"order_no":"B%[5]s', j, '","status":"CREATED","user_id":%[1]d,"sku_id":', 20001 + j %% 100,
         ',"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000}\n'),
  %[9]s
FROM (SELECT %[2]d + i AS j FROM s WHERE i < %[3]d) AS t
ORDER BY j`, u, from, to-from, n, fmt.Sprintf("b%03x", tag%4096), to, digitsExpr(to-from), digitsFrom(to-from), times)
			if _, err := db.ExecContext(ctx, q); err != nil {
				return statements, fmt.Errorf("bulk load (scope %d, rows %d..%d): %w", u, from, to, err)
			}
			statements++
		}
	}
	return statements, nil
}

// digitsExpr and digitsFrom generate 0 .. 10^k-1 for the smallest k with
// 10^k >= n, from k copies of the ten-row digits CTE.
func digitsExpr(n int64) string {
	var terms []string
	for k, p := 0, int64(1); k == 0 || p < n; k, p = k+1, p*10 {
		terms = append(terms, fmt.Sprintf("%d*d%d.n", p, k))
	}
	return strings.Join(terms, " + ")
}

func digitsFrom(n int64) string {
	var tables []string
	for k, p := 0, int64(1); k == 0 || p < n; k, p = k+1, p*10 {
		tables = append(tables, fmt.Sprintf("d AS d%d", k))
	}
	return strings.Join(tables, ", ")
}

func tableMB(ctx context.Context, db *sql.DB) float64 {
	var mb sql.NullFloat64
	_, _ = db.ExecContext(ctx, "ANALYZE TABLE idempotency_record")
	_ = db.QueryRowContext(ctx, `SELECT (data_length + index_length) / 1048576 FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'idempotency_record'`).Scan(&mb)
	return mb.Float64
}

// settle waits (up to limit) until InnoDB has written back most of the
// pages a bulk load dirtied, so that the load's write-back does not run
// under the next measurement: a table of that size in service is not in
// the middle of its own bulk load. It returns how long it waited.
func settle(ctx context.Context, db *sql.DB, limit time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < limit {
		var name string
		var dirty, total float64
		if db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'").Scan(&name, &dirty) != nil ||
			db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_total'").Scan(&name, &total) != nil {
			break
		}
		if total == 0 || dirty/total < 0.01 {
			break
		}
		select {
		case <-ctx.Done():
			return time.Since(start)
		case <-time.After(500 * time.Millisecond):
		}
	}
	return time.Since(start)
}

// runB4 measures B1 (first request, in each mode, with random and with
// time-ordered keys) and B2 (replay, cache off: the cache would hide the
// table) on one MariaDB database as it grows
// through levels of existing records, each point alternating with B0 at the
// same level: levels are measured minutes apart, so each is compared through
// its own B0.
func (r *runner) runB4(ctx context.Context, f *family) error {
	fmt.Fprintf(os.Stderr, "== %s: B4 first request and replay vs existing records %v\n", f.name, r.opts.b4Levels)
	base, err := f.baselineTarget()
	if err != nil {
		return err
	}
	first := map[idempotency.Mode]target{}
	for _, m := range r.opts.modes {
		if first[m], err = f.firstTarget(idempotency.Config{Mode: m}); err != nil {
			return err
		}
	}
	c := r.opts.b4Conc
	var loaded int64
	for i, level := range r.opts.b4Levels {
		if level > loaded {
			fmt.Fprintf(os.Stderr, "  loading %d records ...\n", level-loaded)
			start := time.Now()
			n, err := bulkLoad(ctx, f.db, level-loaded, i+1, false)
			if err != nil {
				return err
			}
			lt := LoadTiming{From: loaded, To: level, Seconds: time.Since(start).Seconds(), Statements: n}
			lt.RowsPerSec = float64(level-loaded) / lt.Seconds
			lt.TableMB = tableMB(ctx, f.db)
			lt.SettleSeconds = settle(ctx, f.db, r.opts.settleMax).Seconds()
			r.b4loads = append(r.b4loads, lt)
			fmt.Fprintf(os.Stderr, "  loaded %d records in %.1f s (%.0f rows/s, %d statements); idempotency_record is %.0f MB; write-back settled in %.1f s\n",
				level-loaded, lt.Seconds, lt.RowsPerSec, n, lt.TableMB, lt.SettleSeconds)
			loaded = level
		}
		// A fresh pool per level: its keys land among the existing records.
		pool, err := createPool(f.client, first[idempotency.ModeClaimFirst], r.opts.poolSize, 16)
		if err != nil {
			return err
		}
		replay, err := f.replayTarget(idempotency.Config{ReplayCacheBytes: -1}, pool)
		if err != nil {
			return err
		}
		// Quick mode (about two minutes in all) keeps B4 to the default mode
		// and half-length windows.
		modes, window, slices := r.opts.modes, r.opts.duration, r.opts.slices
		if r.opts.quick {
			modes, window, slices = modes[:1], window/2, 2
		}
		// New keys of both kinds side by side, each through its own B0: a
		// random key's record lands at a random page of the primary key, a
		// time-ordered one's next to the last one's.
		for _, m := range modes {
			for _, k := range b4KeyKinds {
				t := first[m]
				t.gen = genKeysOf(k)
				r.measureAgainstFor(window, slices, f.client, f.probe, f.name, c, level, "B4:B0", base, "B4:B1", modeName(m)+", "+k.name, t)
			}
		}
		r.measureAgainstFor(window, slices, f.client, f.probe, f.name, c, level, "B4:B0", base, "B4:B2", "claim-first, cache off", replay)
		// At the largest level, new keys with and without a purge beside
		// them (purge.go).
		if i == len(r.opts.b4Levels)-1 && level > 0 {
			if err := r.runB4Purge(ctx, f, level, i+2, first, modes, window, slices); err != nil {
				return err
			}
		}
	}
	return nil
}

// b4Markdown writes the B4 section, if B4 ran.
func (rep *Report) b4Markdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if pts := rep.pointsOf(func(p *Point) bool { return strings.HasPrefix(p.Bench, "B4") }); len(pts) > 0 {
		w("## B4: existing idempotency records (MariaDB)\n\n")
		w("Existing records are DONE records with a 201 snapshot, spread over the benchmark's 16 scopes, with UUID-like keys spread evenly over the key space so new random keys land among them. B1 runs with random (UUIDv4) and with time-ordered (UUIDv7) new keys side by side, each through its own B0: new v7 keys all land at one point among the existing keys that moves only with the clock, as they would at the right edge of a table of older v7 keys. Only idempotency_record grows; purchase_order does not. B2 here runs with the replay cache off (the cache would hide the table) over a fresh pool of %v keys created at each level.\n\n", rep.optionsOf("b4")["replay_pool"])
		w("| load | rows | seconds | rows/s | statements | idempotency_record after | write-back wait |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range rep.B4Loads {
			w("| %s → %s | %d | %.1f | %.0f | %d | %.0f MB | %.1f s |\n", humanCount(l.From), humanCount(l.To), l.To-l.From, l.Seconds, l.RowsPerSec, l.Statements, l.TableMB, l.SettleSeconds)
		}
		settleMax, _ := rep.optionsOf("b4")["settle_max"].(string)
		w("\nAfter each load the run waits for InnoDB to write back the pages the load dirtied (until less than 1%% of the buffer pool is dirty, at most %s), so that little of the load's write-back runs under the next points; a wait as long as the limit means the limit ended it.\n", settleMax)
		w("\nLoader: INSERT … SELECT from a cross join of a ten-row digits CTE, ≤ 500k rows per statement in primary-key order (faster here than LOAD DATA LOCAL INFILE from a generated file: 3.5 s vs 4.0 s for 500k rows, before counting the file's generation).\n\n")
		rep.table(b, "mariadb", pts, true)
		rep.purgeMarkdown(b)
	}
}
