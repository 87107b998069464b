package migrations_test

import (
	"database/sql"
	"testing"

	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/migrations/migrationstest"
)

// MySQLDialect is the MySQL/MariaDB dialect of the migrations conformance
// suite (the SQLite store's module runs it for SQLite).
var MySQLDialect = migrationstest.Dialect{
	Name: "mysql",
	Open: func(t *testing.T) *sql.DB {
		db, _ := testdb.MySQL(t)
		return db
	},
	IndexesQuery: `SELECT table_name, index_name, non_unique = 0,
  GROUP_CONCAT(column_name ORDER BY seq_in_index SEPARATOR ',')
FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name <> 'schema_migrations'
GROUP BY table_name, index_name, non_unique
ORDER BY table_name, index_name`,
}

func TestMigrations_MySQL(t *testing.T) {
	t.Parallel()
	migrationstest.Exercise(t, MySQLDialect)
}
