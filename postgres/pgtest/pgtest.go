// Package pgtest gives each test its own fresh PostgreSQL schema, and the
// pgx connection string URL that names it (search_path), which a program
// under test (the example server, idemctl) can be given whole.
//
// The server comes from IDEMPOTENCY_TEST_POSTGRES_DSN (a pgx connection
// string, default postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
// When it is unreachable the test is skipped with a message, unless CI=true
// or IDEMPOTENCY_REQUIRE_POSTGRES=1, in which case it fails: CI must never
// pass by skipping.
//
// Pools come from postgres.OpenDB, as postgres.Open makes them, whose
// connections send single-phase's record INSERT with the COMMIT. With
// IDEMPOTENCY_TEST_POSTGRES_DRIVER=stdlib they come from pgx's own
// stdlib.OpenDB instead, as for a service that opened its *sql.DB itself;
// the test command runs the module's suites once each way.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
)

// DefaultDSN is used when IDEMPOTENCY_TEST_POSTGRES_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Required reports whether PostgreSQL tests must run (fail instead of skip).
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("IDEMPOTENCY_REQUIRE_POSTGRES") == "1"
}

// baseDSN returns the configured server DSN.
func baseDSN() string {
	if dsn := os.Getenv("IDEMPOTENCY_TEST_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// Postgres creates a new empty schema, returns a pool whose connections
// use it (search_path) and the pool's DSN, and drops the schema when the
// test ends. params are more runtime parameters for every connection, such
// as "default_transaction_isolation": "serializable".
func Postgres(t testing.TB, params ...map[string]string) (*sql.DB, string) {
	t.Helper()
	base := baseDSN()
	adminCfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("pgtest: IDEMPOTENCY_TEST_POSTGRES_DSN %q: %v", base, err)
	}
	admin := sql.OpenDB(patient{stdlib.GetConnector(*adminCfg)})
	t.Cleanup(func() { admin.Close() })
	// Long enough for patient to wait out a server whose connections are
	// all taken for a moment (53300); a server that is down refuses at once.
	ctx, cancel := context.WithTimeout(context.Background(), slotWait+5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		msg := "pgtest: no PostgreSQL at " + adminCfg.Host + " (set IDEMPOTENCY_TEST_POSTGRES_DSN, or start one): " + err.Error()
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}

	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idem_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})

	dsn := WithParams(t, base, map[string]string{"search_path": schema})
	for _, p := range params {
		dsn = WithParams(t, dsn, p)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	db := OpenDB(*cfg)
	db.SetMaxOpenConns(80)
	db.SetMaxIdleConns(80)
	t.Cleanup(func() { db.Close() })
	return db, dsn
}

// OpenDB opens a pool on cfg as postgres.OpenDB does, or as pgx's
// stdlib.OpenDB does when IDEMPOTENCY_TEST_POSTGRES_DRIVER=stdlib, whose
// connection attempts wait for a free server slot (see patient).
func OpenDB(cfg pgx.ConnConfig) *sql.DB {
	if PlainDriver() {
		return sql.OpenDB(patient{stdlib.GetConnector(cfg)})
	}
	return sql.OpenDB(patient{postgres.NewConnector(cfg)})
}

// patient retries a connection attempt that the server refuses for want of
// a slot (53300, too many clients) for up to slotWait. The suites of
// several packages run at once against one server, each test with a pool
// of its own and the example server's pools besides, and the backends of a
// process a spec has just killed linger for a moment: together they can
// touch max_connections (100 by default) for a moment, which is the test
// machine's limit, not a behaviour under test. postgres.NewConnector waits
// for a slot itself, up to postgres.SlotWait; patient waits longer, and for
// pgx's own driver too. Every other error returns at once.
type patient struct{ driver.Connector }

// slotWait bounds how long a connection attempt waits for a server slot.
const slotWait = 20 * time.Second

func (p patient) Connect(ctx context.Context) (driver.Conn, error) {
	deadline := time.Now().Add(slotWait)
	for {
		conn, err := p.Connector.Connect(ctx)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "53300" || time.Now().After(deadline) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// PlainDriver reports whether IDEMPOTENCY_TEST_POSTGRES_DRIVER=stdlib asks
// for pgx's own driver.
func PlainDriver() bool { return os.Getenv("IDEMPOTENCY_TEST_POSTGRES_DRIVER") == "stdlib" }

// WithParams returns the URL dsn with the given query parameters set (pgx
// passes those it does not know on as runtime parameters).
func WithParams(t testing.TB, dsn string, params map[string]string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("pgtest: want a postgres:// URL, got %q", dsn)
	}
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	// pgx reads the query with url.ParseQuery's rules but for "+", which
	// it keeps: spaces must be %20.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// Database runs frontendtest's conformance suite on PostgreSQL: a fresh
// schema per Open, migrated by orderservice.Setup, whose pool is capped so
// that the suites of several front-ends fit the server's connections.
var Database = database{}

type database struct{}

func (database) Name() string { return "postgres" }

func (database) Open(t *testing.T) (*sql.DB, idempotency.Store, string) {
	db, _ := Postgres(t)
	// The suites of several front-ends run at once, each with a few
	// databases, against one server's 100 connections: requests beyond
	// the pool wait for one, which no spec's invariant depends on.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	return db, postgres.NewStore(db), "postgres"
}

func (database) Unreachable(t *testing.T) idempotency.Store {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg, err := pgx.ParseConfig("postgres://postgres@" + addr + "/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	db := postgres.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return postgres.NewStore(db)
}

func (database) Deadlock() error {
	return &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}
}
