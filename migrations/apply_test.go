package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/sqlite"
)

// dialect is one database the migrations must work on: how a test gets a
// fresh, empty database of it and how it describes that database's schema.
type dialect struct {
	name string
	open func(t *testing.T) *sql.DB
	// indexesQuery lists, for every table but schema_migrations, each index
	// as (table, index, unique, comma-separated columns in index order),
	// sorted by table and index.
	indexesQuery string
}

var dialects = []dialect{
	{
		name: "mysql",
		open: func(t *testing.T) *sql.DB {
			db, _ := testdb.MySQL(t)
			return db
		},
		indexesQuery: `SELECT table_name, index_name, non_unique = 0,
  GROUP_CONCAT(column_name ORDER BY seq_in_index SEPARATOR ',')
FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name <> 'schema_migrations'
GROUP BY table_name, index_name, non_unique
ORDER BY table_name, index_name`,
	},
	{
		name: "sqlite",
		open: func(t *testing.T) *sql.DB {
			db, err := sqlite.Open(filepath.Join(t.TempDir(), "migrations.db"))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			return db
		},
		indexesQuery: `SELECT m.name, il.name, il."unique",
  group_concat(ii.name, ',' ORDER BY ii.seqno)
FROM sqlite_master AS m
JOIN pragma_index_list(m.name) AS il
JOIN pragma_index_info(il.name) AS ii
WHERE m.type = 'table' AND m.name NOT IN ('schema_migrations', 'sqlite_sequence')
GROUP BY m.name, il.name, il."unique"
ORDER BY m.name, il.name`,
	},
}

// indexes describes the schema of db as one line per index, such as
// "idempotency_record.idx_idempotency_record_status_expiry (status,expires_at)".
func (d dialect) indexes(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(d.indexesQuery)
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

func TestApply_AfterACrashBetweenAStatementAndItsVersionRow_CompletesOnRerun(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := d.open(t)
			require.NoError(t, migrations.Apply(ctx, db, d.name))
			migrated := d.indexes(t, db)
			require.Contains(t, migrated, "idempotency_record.idx_idempotency_record_status_expiry (status,expires_at)")

			list, err := migrations.List(d.name)
			require.NoError(t, err)
			for _, m := range list {
				t.Run(fmt.Sprintf("%03d_%s", m.Version, m.Name), func(t *testing.T) {
					// Every statement from version m on ran, but the process
					// died before recording m.
					_, err := db.Exec("DELETE FROM schema_migrations WHERE version >= ?", m.Version)
					require.NoError(t, err)

					require.NoError(t, migrations.Apply(ctx, db, d.name))
					require.Equal(t, allVersions(t, d.name), versions(t, db))
					require.Equal(t, migrated, d.indexes(t, db))
				})
			}
		})
	}
}

// schemaAt describes the schema that migrating a fresh database of d up to
// version leaves.
func (d dialect) schemaAt(t *testing.T, version int) []string {
	t.Helper()
	db := d.open(t)
	require.NoError(t, migrations.ApplyTo(context.Background(), db, d.name, version))
	return d.indexes(t, db)
}

// runSteps runs steps on one connection of db as Apply does.
func runSteps(t *testing.T, db *sql.DB, steps []migrations.Step) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	for _, s := range steps {
		_, err := migrations.RunStep(ctx, conn, s)
		require.NoError(t, err, s.SQL)
	}
}

func TestApply_AfterACrashInsideAMigration_CompletesOnRerun(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			list, err := migrations.List(d.name)
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
						db := d.open(t)
						require.NoError(t, migrations.ApplyTo(ctx, db, d.name, m.Version-1))
						runSteps(t, db, steps[:ran])

						require.NoError(t, migrations.Apply(ctx, db, d.name))
						require.Equal(t, allVersions(t, d.name), versions(t, db))
						require.Equal(t, migrated, d.indexes(t, db))
					})
				}
			}
		})
	}
}

func TestApply_Twice_IsANoOp(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := d.open(t)
			require.NoError(t, migrations.Apply(ctx, db, d.name))
			rows := appliedRows(t, db)
			schema := d.indexes(t, db)

			require.NoError(t, migrations.Apply(ctx, db, d.name))
			require.Equal(t, rows, appliedRows(t, db), "no version is recorded again")
			require.Equal(t, schema, d.indexes(t, db))
		})
	}
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

func TestApply_FromFourGoroutinesOnAFreshDatabase_RecordsEveryVersionOnce(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := d.open(t)
			errs := make(chan error, 4)
			for range 4 {
				go func() { errs <- migrations.Apply(ctx, db, d.name) }()
			}
			for range 4 {
				require.NoError(t, <-errs)
			}
			list, err := migrations.List(d.name)
			require.NoError(t, err)
			require.Equal(t, allVersions(t, d.name), versions(t, db))
			require.Equal(t, d.schemaAt(t, list[len(list)-1].Version), d.indexes(t, db))
		})
	}
}

func TestDownMigration_RerunAfterACrashAtAnyStatement_RestoresThePreviousVersion(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			list, err := migrations.List(d.name)
			require.NoError(t, err)
			for _, m := range list {
				steps, err := migrations.Steps(m.Down)
				require.NoError(t, err)
				previous := d.schemaAt(t, m.Version-1)
				for ran := 0; ran < len(steps); ran++ {
					t.Run(fmt.Sprintf("%03d_%s/after statement %d of %d", m.Version, m.Name, ran, len(steps)), func(t *testing.T) {
						t.Parallel()
						db := d.open(t)
						require.NoError(t, migrations.ApplyTo(context.Background(), db, d.name, m.Version))
						runSteps(t, db, steps[:ran])

						runSteps(t, db, steps)
						require.Equal(t, previous, d.indexes(t, db))
						runSteps(t, db, steps)
						require.Equal(t, previous, d.indexes(t, db), "once more after it completed")
					})
				}
			}
		})
	}
}
