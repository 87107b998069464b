package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/migrations/migrationstest"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/storetest"
)

// newPostgres returns a pool over a fresh, migrated schema.
func newPostgres(t *testing.T, params ...map[string]string) *sql.DB {
	t.Helper()
	db, _ := pgtest.Postgres(t, params...)
	require.NoError(t, postgres.Migrate(context.Background(), db))
	return db
}

func TestStore_Conformance(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(t *testing.T) idempotency.Store {
		return postgres.NewStore(newPostgres(t))
	})
}

// The suite again with every connection at REPEATABLE READ by default: a
// statement that meets a row changed since it began fails with 40001
// instead of re-reading it, and the store retries it.
func TestStore_Conformance_RepeatableReadDefault(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(t *testing.T) idempotency.Store {
		return postgres.NewStore(newPostgres(t, map[string]string{"default_transaction_isolation": "repeatable read"}))
	})
}

func TestStore_OperatorQueries(t *testing.T) {
	t.Parallel()
	storetest.ExerciseStats(t, func(t *testing.T) *idempotency.SQLStore {
		return postgres.NewStore(newPostgres(t))
	})
}

func TestMigrations_Conformance(t *testing.T) {
	t.Parallel()
	migrationstest.Exercise(t, migrationstest.Dialect{
		Name: "postgres",
		Open: func(t *testing.T) *sql.DB {
			db, _ := pgtest.Postgres(t)
			return db
		},
		IndexesQuery: `SELECT t.relname, i.relname, ix.indisunique,
  string_agg(a.attname, ',' ORDER BY k.ord)
FROM pg_index ix
JOIN pg_class i ON i.oid = ix.indexrelid
JOIN pg_class t ON t.oid = ix.indrelid
CROSS JOIN LATERAL unnest(ix.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
WHERE t.relnamespace = current_schema()::regnamespace AND t.relname <> 'schema_migrations'
GROUP BY t.relname, i.relname, ix.indisunique
ORDER BY 1, 2`,
	})
}

func TestMigrate_TwiceAndConcurrently_IsSafe(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	ctx := context.Background()
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- postgres.Migrate(ctx, db) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM schema_migrations").Scan(&n))
	all, err := migrations.List("postgres")
	require.NoError(t, err)
	require.Equal(t, len(all), n, "each version applied once")
}

func TestMigrations_SameVersionsAsMySQL_EachStatementSafeToRepeat(t *testing.T) {
	t.Parallel()
	pg, err := migrations.List("postgres")
	require.NoError(t, err)
	my, err := migrations.List("mysql")
	require.NoError(t, err)
	require.Len(t, pg, len(my))
	for i, m := range pg {
		require.Equal(t, my[i].Version, m.Version)
		require.Equal(t, my[i].Name, m.Name, "dialects migrate through the same steps")
		for direction, script := range map[string]string{"up": m.Up, "down": m.Down} {
			steps, err := migrations.Steps(script)
			require.NoError(t, err)
			require.NotEmpty(t, steps, "%03d %s", m.Version, direction)
			for _, s := range steps {
				if s.RunIf == "" {
					require.Regexp(t, `^(CREATE TABLE IF NOT EXISTS|DROP TABLE IF EXISTS|CREATE (UNIQUE )?INDEX IF NOT EXISTS|DROP INDEX IF EXISTS|ALTER TABLE \w+ DROP CONSTRAINT IF EXISTS) `,
						s.SQL, "%03d_%s.%s.sql: make it idempotent or guard it", m.Version, m.Name, direction)
				}
			}
		}
	}
}

// recordChecks lists the CHECK constraints of the record table.
func recordChecks(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT conname FROM pg_constraint
WHERE conrelid = 'idempotency_record'::regclass AND contype = 'c' ORDER BY conname`)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	return names
}

// Migration 004 drops the record table's CHECKs: PostgreSQL re-plans each
// of them at the start of every INSERT, about half of what single-phase's
// record cost a create. Its down script puts them back, and both
// directions may run twice.
func TestMigration004_DropsTheRecordChecks_DownRestoresThem(t *testing.T) {
	t.Parallel()
	db := newPostgres(t)
	require.Empty(t, recordChecks(t, db), "a migrated table has no CHECK constraints")

	all, err := migrations.List("postgres")
	require.NoError(t, err)
	m := all[3]
	require.Equal(t, 4, m.Version)
	want := []string{
		"idempotency_record_idempotency_key_check", "idempotency_record_locked_by_check",
		"idempotency_record_request_fingerprint_check", "idempotency_record_scope_check",
		"idempotency_record_status_check",
	}
	down, err := migrations.Steps(m.Down)
	require.NoError(t, err)
	up, err := migrations.Steps(m.Up)
	require.NoError(t, err)
	for range 2 {
		migrationstest.RunSteps(t, db, down)
		require.Equal(t, want, recordChecks(t, db), "down restores 001's constraints")
	}
	_, err = db.Exec(`INSERT INTO idempotency_record (scope, idempotency_key, request_fingerprint, status, locked_by,
  lease_version, created_at, updated_at, expires_at) VALUES ('s', 'k', 'f', 'UNKNOWN', 'o', 1, now(), now(), now())`)
	require.ErrorContains(t, err, "idempotency_record_status_check", "the restored constraints are enforced")
	for range 2 {
		migrationstest.RunSteps(t, db, up)
		require.Empty(t, recordChecks(t, db))
	}
}
