package idempotency_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/storetest"
)

// newMySQL returns a fresh, migrated MariaDB/MySQL database on a pool from
// idempotency.OpenMySQL, the way the README opens one: the middleware's
// specifications run with the record's statement sent with the COMMIT.
// The chaos specifications open go-sql-driver's own pool (sql.Open), so both
// ways are specified.
func newMySQL(t *testing.T) *sql.DB {
	t.Helper()
	plain, dsn := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), plain))
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	db, err := idempotency.OpenMySQL(cfg)
	require.NoError(t, err)
	db.SetMaxOpenConns(80)
	db.SetMaxIdleConns(80)
	t.Cleanup(func() { db.Close() })
	return db
}

// newPlainMySQL is newMySQL on go-sql-driver's own pool.
func newPlainMySQL(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	return db
}

func TestMySQLStore_Conformance(t *testing.T) {
	t.Parallel()
	t.Run("OpenMySQL", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, func(t *testing.T) idempotency.Store {
			return idempotency.NewMySQLStore(newMySQL(t))
		})
	})
	t.Run("sql.Open", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, func(t *testing.T) idempotency.Store {
			return idempotency.NewMySQLStore(newPlainMySQL(t))
		})
	})
}

func TestMigrate_TwiceAndConcurrently_IsSafe(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	ctx := context.Background()
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- idempotency.Migrate(ctx, db) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM schema_migrations").Scan(&n))
	all, err := migrations.List("mysql")
	require.NoError(t, err)
	require.Equal(t, len(all), n, "each version applied once")
}

func TestMySQLStore_OperatorQueries(t *testing.T) {
	t.Parallel()
	storetest.ExerciseStats(t, func(t *testing.T) *idempotency.SQLStore {
		return idempotency.NewMySQLStore(newMySQL(t))
	})
}
