package pgtest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/postgres/pgtest"
)

// A pool from pgtest waits for a server slot instead of failing: a role
// with CONNECTION LIMIT 1 makes the server refuse a second connection with
// 53300, the code it gives when max_connections is reached.
func TestOpenDB_WaitsForAServerSlot_OtherErrorsReturnAtOnce(t *testing.T) {
	admin, dsn := pgtest.Postgres(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "pgtest_slot_" + hex.EncodeToString(b[:])
	_, err := admin.Exec("CREATE ROLE " + role + " LOGIN CONNECTION LIMIT 1")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec("DROP ROLE IF EXISTS " + role) })

	base, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg := base.Copy()
	cfg.User = role
	ctx := context.Background()
	holder, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)

	impatient := stdlib.OpenDB(*cfg)
	defer impatient.Close()
	err = impatient.PingContext(ctx)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "the server refuses a second connection")
	require.Equal(t, "53300", pe.Code)

	db := pgtest.OpenDB(*cfg)
	defer db.Close()
	released := time.Now().Add(300 * time.Millisecond)
	time.AfterFunc(time.Until(released), func() { holder.Close(ctx) })
	require.NoError(t, db.PingContext(ctx), "the attempt waits for the slot")
	require.False(t, time.Now().Before(released), "it connected only once the slot was free")

	// Any other refusal returns at once: a missing database costs the
	// pool exactly the dials one attempt of pgx's own driver makes.
	missing := base.Copy()
	missing.Database = "pgtest_no_such_database"
	var dials atomic.Int64
	dial := missing.DialFunc
	missing.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	plain := stdlib.OpenDB(*missing)
	defer plain.Close()
	err = plain.PingContext(ctx)
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "3D000", pe.Code)
	once := dials.Swap(0)
	require.Positive(t, once)

	err = pgtest.OpenDB(*missing).PingContext(ctx)
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "3D000", pe.Code)
	require.Equal(t, once, dials.Load(), "an error other than 53300 is not retried: one attempt's dials")
}
