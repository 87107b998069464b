package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/migrations/migrationstest"
	"github.com/orderguard/idempotency/sqlite"
)

// sqliteDialect is the SQLite dialect of the migrations conformance suite.
var sqliteDialect = migrationstest.Dialect{
	Name: "sqlite",
	Open: func(t *testing.T) *sql.DB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "migrations.db"))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		return db
	},
	IndexesQuery: `SELECT m.name, il.name, il."unique",
  group_concat(ii.name, ',' ORDER BY ii.seqno)
FROM sqlite_master AS m
JOIN pragma_index_list(m.name) AS il
JOIN pragma_index_info(il.name) AS ii
WHERE m.type = 'table' AND m.name NOT IN ('schema_migrations', 'sqlite_sequence')
GROUP BY m.name, il.name, il."unique"
ORDER BY m.name, il.name`,
}

func TestMigrations_SQLite(t *testing.T) {
	t.Parallel()
	migrationstest.Exercise(t, sqliteDialect)
}
