// Package migrationstest is the conformance suite for the migrations of one
// dialect: a crash at any statement, or between a migration and its version
// row, is completed by the next Apply, and so is a crashed down migration.
// Each dialect's package runs it against its real database.
package migrationstest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/migrations"
)

// Dialect is one database the migrations must work on: how a test gets a
// fresh, empty database of it and how it describes that database's schema.
type Dialect struct {
	// Name is the migrations' dialect ("mysql", "sqlite", or one registered
	// with migrations.Register, such as "postgres").
	Name string
	// Open returns a fresh, empty database, closed when the test ends.
	Open func(t *testing.T) *sql.DB
	// IndexesQuery lists, for every table but schema_migrations, each index
	// as (table, index, unique, comma-separated columns in index order),
	// sorted by table and index.
	IndexesQuery string
}

// indexes describes the schema of db as one line per index, such as
// "idempotency_record.idx_idempotency_record_status_expiry (status,expires_at)".
func (d Dialect) indexes(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(d.IndexesQuery)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var table, index, columns string
		var unique bool
		require.NoError(t, rows.Scan(&table, &index, &unique, &columns))
		kind := ""
		if unique {
			kind = " UNIQUE"
		}
		out = append(out, fmt.Sprintf("%s.%s%s (%s)", table, index, kind, columns))
	}
	require.NoError(t, rows.Err())
	return out
}

// versions lists the rows of schema_migrations as "NNN_name".
func versions(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT version, name FROM schema_migrations ORDER BY version")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var version int
		var name string
		require.NoError(t, rows.Scan(&version, &name))
		out = append(out, fmt.Sprintf("%03d_%s", version, name))
	}
	require.NoError(t, rows.Err())
	return out
}

// allVersions lists every migration of dialect as "NNN_name".
func allVersions(t *testing.T, dialect string) []string {
	t.Helper()
	list, err := migrations.List(dialect)
	require.NoError(t, err)
	var out []string
	for _, m := range list {
		out = append(out, fmt.Sprintf("%03d_%s", m.Version, m.Name))
	}
	return out
}

func testApply_AfterACrashBetweenAStatementAndItsVersionRow_CompletesOnRerun(t *testing.T, d Dialect) {
	t.Parallel()
	ctx := context.Background()
	db := d.Open(t)
	require.NoError(t, migrations.Apply(ctx, db, d.Name))
	migrated := d.indexes(t, db)
	require.Contains(t, migrated, "idempotency_record.idx_idempotency_record_status_expiry (status,expires_at)")

	list, err := migrations.List(d.Name)
	require.NoError(t, err)
	for _, m := range list {
		t.Run(fmt.Sprintf("%03d_%s", m.Version, m.Name), func(t *testing.T) {
			// Every statement from version m on ran, but the process
			// died before recording m.
			// The version is formatted in, not bound: placeholders are
			// ? or $1 by dialect.
			_, err := db.Exec(fmt.Sprintf("DELETE FROM schema_migrations WHERE version >= %d", m.Version))
			require.NoError(t, err)

			require.NoError(t, migrations.Apply(ctx, db, d.Name))
			require.Equal(t, allVersions(t, d.Name), versions(t, db))
			require.Equal(t, migrated, d.indexes(t, db))
		})
	}
}

// schemaAt describes the schema that migrating a fresh database of d up to

// version leaves.

func (d Dialect) schemaAt(t *testing.T, version int) []string {
	t.Helper()
	db := d.Open(t)
	require.NoError(t, migrations.ApplyTo(context.Background(), db, d.Name, version))
	return d.indexes(t, db)
}

// RunSteps runs steps on one connection of db as Apply does, for a test of
// one migration script (migrations.Steps splits it).

func RunSteps(t *testing.T, db *sql.DB, steps []migrations.Step) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	for _, s := range steps {
		_, err := s.Run(ctx, conn)
		require.NoError(t, err, s.SQL)
	}
}

func testApply_AfterACrashInsideAMigration_CompletesOnRerun(t *testing.T, d Dialect) {
	t.Parallel()
	list, err := migrations.List(d.Name)
	require.NoError(t, err)
	migrated := d.schemaAt(t, list[len(list)-1].Version)
	for _, m := range list {
		steps, err := migrations.Steps(m.Up)
		require.NoError(t, err)
		// A crash after the last statement is the case of the test
		// above; a crash inside a statement is one before it, as each
		// DDL statement is atomic.
		for ran := 1; ran < len(steps); ran++ {
			t.Run(fmt.Sprintf("%03d_%s/after statement %d of %d", m.Version, m.Name, ran, len(steps)), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := d.Open(t)
				require.NoError(t, migrations.ApplyTo(ctx, db, d.Name, m.Version-1))
				RunSteps(t, db, steps[:ran])

				require.NoError(t, migrations.Apply(ctx, db, d.Name))
				require.Equal(t, allVersions(t, d.Name), versions(t, db))
				require.Equal(t, migrated, d.indexes(t, db))
			})
		}
	}
}

func testApply_Twice_IsANoOp(t *testing.T, d Dialect) {
	t.Parallel()
	ctx := context.Background()
	db := d.Open(t)
	require.NoError(t, migrations.Apply(ctx, db, d.Name))
	rows := appliedRows(t, db)
	schema := d.indexes(t, db)

	require.NoError(t, migrations.Apply(ctx, db, d.Name))
	require.Equal(t, rows, appliedRows(t, db), "no version is recorded again")
	require.Equal(t, schema, d.indexes(t, db))
}

// appliedRows lists the rows of schema_migrations with their applied_at.

func appliedRows(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var version int
		var name, at string
		require.NoError(t, rows.Scan(&version, &name, &at))
		out = append(out, fmt.Sprintf("%03d_%s at %s", version, name, at))
	}
	require.NoError(t, rows.Err())
	return out
}

func testApply_FromFourGoroutinesOnAFreshDatabase_RecordsEveryVersionOnce(t *testing.T, d Dialect) {
	t.Parallel()
	ctx := context.Background()
	db := d.Open(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- migrations.Apply(ctx, db, d.Name) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	list, err := migrations.List(d.Name)
	require.NoError(t, err)
	require.Equal(t, allVersions(t, d.Name), versions(t, db))
	require.Equal(t, d.schemaAt(t, list[len(list)-1].Version), d.indexes(t, db))
}

func testDownMigration_RerunAfterACrashAtAnyStatement_RestoresThePreviousVersion(t *testing.T, d Dialect) {
	t.Parallel()
	list, err := migrations.List(d.Name)
	require.NoError(t, err)
	for _, m := range list {
		steps, err := migrations.Steps(m.Down)
		require.NoError(t, err)
		previous := d.schemaAt(t, m.Version-1)
		for ran := 0; ran < len(steps); ran++ {
			t.Run(fmt.Sprintf("%03d_%s/after statement %d of %d", m.Version, m.Name, ran, len(steps)), func(t *testing.T) {
				t.Parallel()
				db := d.Open(t)
				require.NoError(t, migrations.ApplyTo(context.Background(), db, d.Name, m.Version))
				RunSteps(t, db, steps[:ran])

				RunSteps(t, db, steps)
				require.Equal(t, previous, d.indexes(t, db))
				RunSteps(t, db, steps)
				require.Equal(t, previous, d.indexes(t, db), "once more after it completed")
			})
		}
	}
}

// Exercise runs every spec of the suite against d.
func Exercise(t *testing.T, d Dialect) {
	t.Run("Apply_AfterACrashBetweenAStatementAndItsVersionRow_CompletesOnRerun", func(t *testing.T) { testApply_AfterACrashBetweenAStatementAndItsVersionRow_CompletesOnRerun(t, d) })
	t.Run("Apply_AfterACrashInsideAMigration_CompletesOnRerun", func(t *testing.T) { testApply_AfterACrashInsideAMigration_CompletesOnRerun(t, d) })
	t.Run("Apply_Twice_IsANoOp", func(t *testing.T) { testApply_Twice_IsANoOp(t, d) })
	t.Run("Apply_FromFourGoroutinesOnAFreshDatabase_RecordsEveryVersionOnce", func(t *testing.T) { testApply_FromFourGoroutinesOnAFreshDatabase_RecordsEveryVersionOnce(t, d) })
	t.Run("DownMigration_RerunAfterACrashAtAnyStatement_RestoresThePreviousVersion", func(t *testing.T) { testDownMigration_RerunAfterACrashAtAnyStatement_RestoresThePreviousVersion(t, d) })
}
