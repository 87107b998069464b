// Package migrations holds the versioned SQL schema of the idempotency store,
// one directory per dialect, in the layout golang-migrate and goose users
// recognise: NNN_name.up.sql and NNN_name.down.sql. Apply runs the pending up
// migrations and records each applied version in schema_migrations.
//
// Most users call idempotency.Migrate (MySQL), sqlite.Migrate or
// postgres.Migrate instead. The PostgreSQL files live in the postgres module,
// which registers them here (see Register).
//
// # Re-running after a crash
//
// Apply records a version only after every statement of its migration has
// run, so a process that dies part-way leaves some statements applied and
// the version unrecorded, and the next Apply runs that migration again from
// its first statement. That is safe because each statement either is
// idempotent by itself (CREATE TABLE IF NOT EXISTS, DROP TABLE IF EXISTS, and
// on SQLite CREATE INDEX IF NOT EXISTS and DROP INDEX IF EXISTS) or carries a
// guard, a "-- run if:" comment line before it whose query Apply evaluates on
// the migrating connection; the statement runs only when the query returns a
// non-zero number:
//
//	-- run if: SELECT COUNT(*) > 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_lease'
//	ALTER TABLE idempotency_record DROP INDEX idx_idempotency_record_lease;
//
// MySQL 8 has neither DROP INDEX IF EXISTS nor ADD INDEX IF NOT EXISTS in
// ALTER TABLE, so a MySQL migration makes one guarded change per statement:
// then every point a crash can stop at is a state the next run completes.
// The down migrations follow the same rules, so a revert that stopped
// part-way can be run again too; this package does not run them itself.
// Tools that do not know the directive, such as golang-migrate, read it as a
// comment and run every statement: right on a clean run, without the
// recovery.
//
// On SQLite, whose DDL is transactional, Apply runs in one write transaction,
// so a crash there leaves nothing half done at all.
package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

//go:embed mysql/*.sql sqlite/*.sql
var files embed.FS

// registered holds the migration files of dialects whose store lives in a
// module of its own (see Register).
var (
	registeredMu sync.RWMutex
	registered   = map[string]fs.FS{}
)

// Register makes the migration files in fsys (NNN_name.up.sql and
// .down.sql at its root) the migrations of dialect, for List, FS, Apply and
// ApplyTo: a store in a module of its own embeds its files and registers
// them, as package postgres does for "postgres". Apply knows how to lock
// "mysql", "sqlite" and "postgres". It panics if dialect is already known,
// as sql.Register does.
func Register(dialect string, fsys fs.FS) {
	registeredMu.Lock()
	defer registeredMu.Unlock()
	if _, err := fs.Stat(files, dialect); err == nil || registered[dialect] != nil {
		panic("migrations: Register called twice for dialect " + dialect)
	}
	registered[dialect] = fsys
}

// FS returns the migration files of dialect ("mysql", "sqlite", or a
// registered one).
func FS(dialect string) (fs.FS, error) {
	registeredMu.RLock()
	fsys := registered[dialect]
	registeredMu.RUnlock()
	if fsys != nil {
		return fsys, nil
	}
	if _, err := fs.Stat(files, dialect); err != nil {
		return nil, fmt.Errorf("migrations: unknown dialect %q", dialect)
	}
	return fs.Sub(files, dialect)
}

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// List returns the migrations of dialect in version order.
func List(dialect string) ([]Migration, error) {
	dir, err := FS(dialect)
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(dir, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: dialect %q: %w", dialect, err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		base, direction, ok := cutDirection(name)
		if !ok {
			continue
		}
		num, label, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrations: file %s: want NNN_name.up.sql", name)
		}
		body, err := fs.ReadFile(dir, name)
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: label}
			byVersion[version] = m
		}
		if direction == "up" {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	list := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		list = append(list, *m)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Version < list[j].Version })
	return list, nil
}

func cutDirection(name string) (base, direction string, ok bool) {
	if b, found := strings.CutSuffix(name, ".up.sql"); found {
		return b, "up", true
	}
	if b, found := strings.CutSuffix(name, ".down.sql"); found {
		return b, "down", true
	}
	return "", "", false
}

// Apply runs every migration of dialect not yet recorded in
// schema_migrations, in version order, and records each version once all its
// statements have run. It is safe to call on every start, from several
// processes at once, and again after a run that stopped at any point (see
// the package doc). On MySQL it holds a named lock while it works, waiting up
// to 30s for another migrator, and skips each guarded statement whose effect
// is already there. On SQLite it runs in one write transaction, so another
// migrator waits for it up to the connection's busy_timeout, and a failure
// or crash rolls the whole run back; SQLite migrations must therefore not
// need to run outside a transaction (VACUUM, PRAGMA foreign_keys). On
// PostgreSQL it holds a session advisory lock for the current schema,
// waiting up to 30s, and each statement must be safe to repeat (IF [NOT]
// EXISTS) or guarded, as on MySQL.
func Apply(ctx context.Context, db *sql.DB, dialect string) error {
	return apply(ctx, db, dialect, math.MaxInt)
}

// ApplyTo is Apply stopping after version target: it migrates a database up
// to a given version, not past it (a staged rollout, or a test building the
// state a crash in migration target+1 leaves).
func ApplyTo(ctx context.Context, db *sql.DB, dialect string, target int) error {
	return apply(ctx, db, dialect, target)
}

// apply is Apply stopping after version target.
func apply(ctx context.Context, db *sql.DB, dialect string, target int) (err error) {
	list, err := List(dialect)
	if err != nil {
		return err
	}
	// Parse every script first: a misplaced guard must fail before anything
	// runs, not once the migrations before it are applied.
	steps := make(map[int][]Step, len(list))
	for _, m := range list {
		if steps[m.Version], err = Steps(m.Up); err != nil {
			return fmt.Errorf("migrations: %s/%03d_%s.up.sql: %w", dialect, m.Version, m.Name, err)
		}
	}
	// One connection for the whole run, so the MySQL named lock and the
	// SQLite transaction belong to the session that does the work, and a
	// guard sees the schema the statements before it left.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()

	switch dialect {
	case "mysql":
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('orderguard_idempotency_migrate', 30)").Scan(&got); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		if got.Int64 != 1 {
			return fmt.Errorf("migrations: another process holds the migration lock for over 30s")
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK('orderguard_idempotency_migrate')") //nolint:errcheck
	case "postgres":
		// A session advisory lock, keyed by the schema the tables go to:
		// migrators of one schema queue, those of other schemas do not.
		const key = "hashtext(current_schema() || '.orderguard_idempotency_migrate')"
		lockCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := conn.ExecContext(lockCtx, "SELECT pg_advisory_lock("+key+")")
		cancel()
		if err != nil {
			return fmt.Errorf("migrations: lock (another process may hold it for over 30s): %w", err)
		}
		defer func() {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+key+")"); err != nil {
				// A pooled session would keep the lock: close it instead.
				conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck
			}
		}()
	case "sqlite":
		// SQLite has no named lock. IMMEDIATE takes the write lock at BEGIN,
		// so a second migrator waits here rather than reading a
		// schema_migrations that the first is about to change, and the
		// statements and version rows commit together or not at all. The
		// transaction is begun in SQL because database/sql's BeginTx cannot
		// ask for IMMEDIATE.
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		defer func() {
			if err == nil {
				if _, err = conn.ExecContext(ctx, "COMMIT"); err == nil {
					return
				}
				err = fmt.Errorf("migrations: commit: %w", err)
			}
			if _, rbErr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rbErr != nil {
				// The session may still be inside the transaction: keep it
				// out of the pool.
				conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck
			}
		}()
	}

	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
  version    BIGINT      NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_at VARCHAR(32)  NOT NULL
)`); err != nil {
		return fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	for _, m := range list {
		if m.Version > target {
			break
		}
		if applied[m.Version] {
			continue
		}
		for i, step := range steps[m.Version] {
			if _, err := step.run(ctx, conn); err != nil {
				return fmt.Errorf("migrations: %s %03d_%s statement %d: %w", dialect, m.Version, m.Name, i+1, err)
			}
		}
		record := "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, CURRENT_TIMESTAMP)"
		if dialect == "postgres" {
			record = "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, CURRENT_TIMESTAMP)"
		}
		if _, err := conn.ExecContext(ctx, record, m.Version, m.Name); err != nil {
			return fmt.Errorf("migrations: record %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}
