// Package migrations holds the versioned SQL schema of the idempotency store,
// one directory per dialect, in the layout golang-migrate and goose users
// recognise: NNN_name.up.sql and NNN_name.down.sql. Apply runs the pending up
// migrations and records each applied version in schema_migrations.
//
// Most users call idempotency.Migrate (MySQL) or sqlite.Migrate instead.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed mysql/*.sql sqlite/*.sql
var files embed.FS

// FS returns the embedded migration files of dialect ("mysql" or "sqlite").
func FS(dialect string) (fs.FS, error) {
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
	entries, err := fs.ReadDir(files, dialect)
	if err != nil {
		return nil, fmt.Errorf("migrations: unknown dialect %q", dialect)
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
		body, err := fs.ReadFile(files, dialect+"/"+name)
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
// schema_migrations, in version order. It is safe to call on every start and
// from several processes at once: on MySQL it holds a named lock while it
// works, and every statement is idempotent (IF NOT EXISTS).
func Apply(ctx context.Context, db *sql.DB, dialect string) error {
	list, err := List(dialect)
	if err != nil {
		return err
	}
	// One connection for the whole run, so a MySQL named lock is held by the
	// session that does the work.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()

	if dialect == "mysql" {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('orderguard_idempotency_migrate', 30)").Scan(&got); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		if got.Int64 != 1 {
			return fmt.Errorf("migrations: another process holds the migration lock for over 30s")
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK('orderguard_idempotency_migrate')") //nolint:errcheck
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
		if applied[m.Version] {
			continue
		}
		for _, stmt := range Statements(m.Up) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migrations: %s %03d_%s: %w", dialect, m.Version, m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx,
			"INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, CURRENT_TIMESTAMP)",
			m.Version, m.Name); err != nil {
			return fmt.Errorf("migrations: record %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}

// Statements splits a migration file into statements: comment lines are
// dropped and a statement ends at a line ending with a semicolon. The files
// are ours, so this needs no general SQL lexer.
func Statements(script string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(script) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
