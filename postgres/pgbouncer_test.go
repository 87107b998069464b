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
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// bouncerServerConns is PgBouncer's pool: fewer server connections than
// the requests at once, so transactions of different clients share them.
const bouncerServerConns = 3

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pgBouncer starts PgBouncer in transaction pooling mode in front of a
// fresh schema. Its server connections log in as a role of their own
// whose search_path is that schema: PgBouncer refuses a search_path in the
// startup packet, so it is set on the role. It returns a direct pool as
// that role (migrated, with the ledger tables) and the URL of the bouncer.
func pgBouncer(t *testing.T) (direct *sql.DB, bouncerURL string) {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		msg := "pgbouncer not installed (apt-get install pgbouncer)"
		if os.Getenv("IDEMPOTENCY_REQUIRE_PGBOUNCER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	admin, dsn := pgtest.Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	schema := cfg.RuntimeParams["search_path"]
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "idem_bouncer_" + hex.EncodeToString(b[:])
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"ALTER SCHEMA " + schema + " OWNER TO " + role,
		"ALTER ROLE " + role + " SET search_path = " + schema,
	} {
		_, err := admin.Exec(stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP OWNED BY " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})

	directCfg := cfg.Copy()
	directCfg.User = role
	direct = postgres.OpenDB(*directCfg)
	t.Cleanup(func() { direct.Close() })
	require.NoError(t, postgres.Migrate(context.Background(), direct), "migrate directly, never through transaction pooling")
	_, err = direct.Exec(`CREATE TABLE account (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO account VALUES (1, 1000000), (2, 1000000);
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account bigint NOT NULL, amount bigint NOT NULL, idem_key text NOT NULL)`)
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // PgBouncer refuses to run as root: it reads this as nobody
	ini := filepath.Join(dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(ini, fmt.Appendf(nil, `[databases]
idem = host=%s port=%d dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 200
`, cfg.Host, cfg.Port, cfg.Database, role, port, bouncerServerConns), 0o644))
	args := []string{ini}
	if os.Getuid() == 0 {
		args = []string{"-u", "nobody", ini}
	}
	var out syncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", out.String())
		}
	})

	bouncerURL = (&url.URL{Scheme: "postgres", User: url.User(role), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/idem"}).String()
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true // reported below
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, bouncerURL+"?sslmode=disable")
		if err != nil {
			return false
		}
		_ = c.Close(ctx)
		return true
	}, 15*time.Second, 20*time.Millisecond, "pgbouncer answers")
	select {
	case <-exited:
		t.Fatalf("pgbouncer exited: %s", out.String())
	default:
	}
	return direct, bouncerURL
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
