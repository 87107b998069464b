package main

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/postgres"
)

// The postgres family (issue 12): B0–B3 on PostgreSQL, through the postgres
// store module and the example service's postgres dialect, in the same run
// and report as MariaDB.

// postgresAdmin opens a small pool to the server of url (its own database)
// and checks that it answers within 5 s.
func postgresAdmin(ctx context.Context, url string) (*sql.DB, *pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("-postgres: %w", err)
	}
	admin := stdlib.OpenDB(*cfg)
	admin.SetMaxOpenConns(2)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := admin.PingContext(pctx); err != nil {
		admin.Close()
		return nil, nil, fmt.Errorf("PostgreSQL at %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	return admin, cfg, nil
}

// pingPostgres reports whether the server of url answers.
func pingPostgres(ctx context.Context, url string) error {
	admin, _, err := postgresAdmin(ctx, url)
	if err != nil {
		return err
	}
	return admin.Close()
}

// openPostgres creates a fresh database idembench_<random>_<label> on the
// server of url and opens it as examples/server does (postgres.Open's pool:
// postgres.MaxConns connections, kept open), through the statement-counting
// connector. The database is dropped by close.
func openPostgres(ctx context.Context, url, label string) (*family, error) {
	admin, cfg, err := postgresAdmin(ctx, url)
	if err != nil {
		return nil, err
	}
	f := &family{name: "postgres", dialect: "postgres"}
	f.cleanup = append(f.cleanup, func() { admin.Close() })
	name := databaseName(label)
	// FORCE: a pool closed a moment ago may still be disconnecting.
	if err := f.createDatabase(ctx, admin, name, "CREATE DATABASE "+name, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		f.close()
		return nil, err
	}
	dbCfg := cfg.Copy()
	dbCfg.Database = name
	counts := &sqlCounts{}
	dbCfg.Tracer = &pgxCounter{n: counts}
	db := postgres.OpenDB(*dbCfg)
	db.SetMaxOpenConns(postgres.MaxConns)
	db.SetMaxIdleConns(postgres.MaxConns)
	db.SetConnMaxLifetime(30 * time.Minute)
	f.cleanup = append(f.cleanup, func() { db.Close() })
	f.db = db
	if err := orderservice.Setup(ctx, db, "postgres"); err != nil {
		f.close()
		return nil, fmt.Errorf("setup %s: %w", name, err)
	}
	f.store = postgres.NewStore(db)
	f.client = newClient(64)
	f.probe = postgresProbe(admin, name, counts)
	return f, nil
}

// pgxCounter counts what pgx sends: each statement one round trip
// (prepared statements are cached per connection), and a batch one, a
// commit when it ends with COMMIT (postgres.OpenDB sends single-phase's
// record with the COMMIT).
type pgxCounter struct{ n *sqlCounts }

func (c *pgxCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.trip(d.SQL)
	return ctx
}

func (c *pgxCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// trip counts one round trip whose last statement is sql.
func (c *pgxCounter) trip(sql string) {
	c.n.trips.Add(1)
	if word, _, _ := strings.Cut(strings.TrimSpace(sql), " "); strings.EqualFold(word, "commit") {
		c.n.commits.Add(1)
	}
}

// batchTrip is a batch's one round trip, filed under its last statement.
type batchTrip struct{ last string }

func (c *pgxCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, batchTrip{}, &batchTrip{})
}

func (c *pgxCounter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if b, ok := ctx.Value(batchTrip{}).(*batchTrip); ok {
		b.last = d.SQL
	}
}

func (c *pgxCounter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if b, ok := ctx.Value(batchTrip{}).(*batchTrip); ok {
		c.trip(b.last)
	}
}

// postgresProbe is mariaProbe for PostgreSQL: this process's round trips,
// the WAL syncs (pg_stat_wal, server-wide), and CPU. PostgreSQL serves each
// connection with a process, so cpu_db sums the CPU of the backends
// connected to this family's database (pg_stat_activity, re-read at every
// call as the pool grows) and of the WAL writer, checkpointer and background
// writer; a backend that exits between two calls loses its last interval.
func postgresProbe(admin *sql.DB, dbName string, counts *sqlCounts) func() map[string]float64 {
	cpu := cpuProbe(nil)
	var (
		mu      sync.Mutex
		last    map[int]float64 // CPU seconds per pid at the previous call
		cpuDB   float64         // CPU of the processes seen, since the first call
		started bool
	)
	return func() map[string]float64 {
		out := cpu()
		maps.Copy(out, counts.snapshot())
		var walSyncs float64
		if admin.QueryRow(`SELECT wal_sync FROM pg_stat_wal`).Scan(&walSyncs) == nil {
			out["fsyncs"] = walSyncs
		}
		rows, err := admin.Query(`SELECT pid FROM pg_stat_activity
WHERE datname = $1 OR backend_type IN ('walwriter', 'checkpointer', 'background writer')`, dbName)
		if err != nil {
			return out
		}
		defer rows.Close()
		now := map[int]float64{}
		for rows.Next() {
			var pid int
			if rows.Scan(&pid) == nil {
				now[pid] = procCPU(strconv.Itoa(pid))
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for pid, c := range now {
			prev, seen := last[pid]
			switch {
			case seen:
				cpuDB += max(0, c-prev)
			case started:
				cpuDB += c // started since the previous call
			}
		}
		last, started = now, true
		out["cpu_db"] = cpuDB
		return out
	}
}

// describePostgres returns the server's version and the settings that decide
// what a commit costs.
func describePostgres(ctx context.Context, url string) (string, map[string]string) {
	admin, _, err := postgresAdmin(ctx, url)
	if err != nil {
		return "", nil
	}
	defer admin.Close()
	var version string
	_ = admin.QueryRowContext(ctx, "SHOW server_version").Scan(&version)
	return version, queryPairs(ctx, admin, `SELECT name, current_setting(name) FROM pg_settings WHERE name IN
('shared_buffers', 'synchronous_commit', 'fsync', 'wal_sync_method', 'full_page_writes', 'commit_delay', 'max_connections')`)
}
