package postgres_test

// The store behind PgBouncer in transaction pooling, the answer for more
// instances than a server's max_connections holds (README, "PostgreSQL
// connections"): PgBouncer runs on a loopback port in front of the test
// server with three server connections, and the middleware in both modes
// makes one effect per key through it, single-phase's record INSERT riding
// with the COMMIT in one pipeline as on a direct connection.
//
// The specs need the pgbouncer binary (Debian's pgbouncer package). They
// are skipped without it unless IDEMPOTENCY_REQUIRE_PGBOUNCER=1.

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// bouncerServerConns is PgBouncer's pool: fewer server connections than
// the requests at once, so transactions of different clients share them.
const bouncerServerConns = 3

// pgBouncer starts PgBouncer in transaction pooling mode in front of a
// fresh schema (pgtest.PgBouncer). It returns a direct pool as the
// bouncer's role (migrated, with the ledger tables) and the URL of the
// bouncer.
func pgBouncer(t *testing.T) (direct *sql.DB, bouncerURL string) {
	t.Helper()
	b := pgtest.PgBouncer(t, "transaction", bouncerServerConns)
	direct = postgres.OpenDB(b.Direct)
	t.Cleanup(func() { direct.Close() })
	require.NoError(t, postgres.Migrate(context.Background(), direct), "migrate directly, never through transaction pooling")
	_, err := direct.Exec(`CREATE TABLE account (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO account VALUES (1, 1000000), (2, 1000000);
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account bigint NOT NULL, amount bigint NOT NULL, idem_key text NOT NULL)`)
	require.NoError(t, err)
	return direct, b.URL
}

// Through PgBouncer in transaction pooling, a pool from Open must not keep
// named prepared statements between transactions, which PgBouncer before
// 1.21 does not carry from one server connection to the next:
// default_query_exec_mode=cache_describe in the URL prepares each
// statement unnamed in the round trip that runs it. With that, both modes
// make one effect per key under concurrent duplicates, and the record
// INSERT that single-phase sends with the COMMIT stays inside the
// transaction, on one server connection.
func TestPgBouncer_TransactionPooling_BothModes_OneEffectPerKeyAndEveryDuplicateTheSameAnswer(t *testing.T) {
	t.Parallel()
	direct, bouncer := pgBouncer(t)
	app, err := postgres.Open(bouncer + "?sslmode=disable&default_query_exec_mode=cache_describe")
	require.NoError(t, err)
	t.Cleanup(func() { app.Close() })

	const keys, senders = 12, 6
	for _, mode := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		store := postgres.NewStore(app)
		mw, err := idempotency.New(store, &idempotency.Config{Mode: mode, InFlightWait: 20 * time.Second})
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Handler(&ledgerService{}))
		b := &testBundle{db: direct, store: store, srv: srv}

		answers := make([][]answer, keys)
		var wg sync.WaitGroup
		for k := range keys {
			wg.Go(func() {
				answers[k] = b.storm(t, senders, fmt.Sprintf("mode%d-%d", mode, k), `{"account":1,"amount":1}`)
			})
		}
		wg.Wait()
		srv.Close()

		for k, as := range answers {
			key := fmt.Sprintf("mode%d-%d", mode, k)
			for i, a := range as {
				require.Equal(t, http.StatusCreated, a.Status, "%s, sender %d: %s", key, i, a.Body)
				require.Equal(t, as[0].Body, a.Body, "%s: every duplicate gets the first answer", key)
			}
			require.EqualValues(t, 1, b.count(t, `SELECT COUNT(*) FROM ledger WHERE idem_key = $1`, key), "%s: one effect", key)
		}
	}
}
