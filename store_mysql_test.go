package idempotency_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/storetest"
)

// newMySQL returns a fresh, migrated MariaDB/MySQL database.
func newMySQL(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	return db
}

func TestMySQLStore_Conformance(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(t *testing.T) idempotency.Store {
		return idempotency.NewMySQLStore(newMySQL(t))
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
