package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// TestIsTransient_Postgres_NoServerTakesWrites: a pool whose URL asks for a
// server that takes writes (target_session_attrs=read-write, as a
// multi-host URL over a Patroni cluster does) and reaches only servers that
// do not fails its connection attempts with pgx's "read only connection".
// During a switchover, or while a leader that lost etcd has demoted itself,
// every node is a standby for a moment: the gap of a failover, which the
// next attempt may find over. So the failure is transient, and a handler
// that meets it (the example service's GET /orders/{order_no}) answers 503
// with Retry-After, not 500. default_transaction_read_only=on makes the
// test server answer as a standby does.
func TestIsTransient_Postgres_NoServerTakesWrites(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Postgres(t)
	readOnly := pgtest.WithParams(t, dsn, map[string]string{
		"target_session_attrs": "read-write", "default_transaction_read_only": "on",
	})
	cfg, err := pgx.ParseConfig(readOnly)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("OpenDB", func(t *testing.T) {
		db := postgres.OpenDB(*cfg)
		defer db.Close()
		err := db.PingContext(ctx)
		require.ErrorIs(t, err, pgconn.ErrReadOnlyConnection)
		require.True(t, idempotency.IsTransient(err), "no server takes writes yet: %v", err)
	})
	t.Run("Open", func(t *testing.T) {
		_, err := postgres.Open(readOnly)
		require.ErrorIs(t, err, pgconn.ErrReadOnlyConnection)
		require.True(t, idempotency.IsTransient(err), "no server takes writes yet: %v", err)
	})
}
