package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bouncer is a PgBouncer process in front of a fresh schema, started by
// PgBouncer for one test.
type Bouncer struct {
	// URL reaches the schema through PgBouncer as Role, with no query
	// parameters: PgBouncer refuses startup parameters it does not know,
	// so search_path is set on the role instead.
	URL string
	// Direct reaches the same schema on the server itself, as Role: for
	// migrations, whose session advisory lock needs one server connection
	// throughout, and for checks that must not pass through the bouncer.
	Direct pgx.ConnConfig
	Role   string
}

// PgBouncer starts PgBouncer (Debian's pgbouncer package) in poolMode
// ("session" or "transaction") with serverConns connections to the server,
// in front of a fresh schema (Postgres). Its server connections log in as
// a role of their own that owns the schema and has it as search_path. The
// test is skipped without the pgbouncer binary, unless
// IDEMPOTENCY_REQUIRE_PGBOUNCER=1; PgBouncer is stopped when it ends, and
// its log printed if the test failed.
func PgBouncer(t testing.TB, poolMode string, serverConns int) Bouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		msg := "pgtest: pgbouncer not installed (apt-get install pgbouncer)"
		if os.Getenv("IDEMPOTENCY_REQUIRE_PGBOUNCER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	admin, dsn := Postgres(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	schema := cfg.RuntimeParams["search_path"]
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "idem_bouncer_" + hex.EncodeToString(b[:])
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"ALTER SCHEMA " + schema + " OWNER TO " + role,
		"ALTER ROLE " + role + " SET search_path = " + schema,
	} {
		if _, err := admin.Exec(stmt); err != nil {
			t.Fatalf("pgtest: %s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		// DROP OWNED takes the schema's tables; the role goes once
		// PgBouncer, stopped before this runs, has closed its sessions.
		_, _ = admin.Exec("DROP OWNED BY " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil { // run as nobody, PgBouncer reads its ini from here
		t.Fatalf("pgtest: %v", err)
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, fmt.Appendf(nil, `[databases]
idem = host=%s port=%d dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = %s
default_pool_size = %d
max_client_conn = 400
`, cfg.Host, cfg.Port, cfg.Database, role, port, poolMode, serverConns), 0o644); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	args := []string{ini}
	if os.Getuid() == 0 {
		args = []string{"-u", "nobody", ini} // PgBouncer refuses to run as root
	}
	var out lockedBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", out.String())
		}
	})

	bouncerURL := (&url.URL{Scheme: "postgres", User: url.User(role), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/idem"}).String()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("pgtest: pgbouncer exited: %s", out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, bouncerURL+"?sslmode=disable")
		if err == nil {
			_ = c.Close(ctx)
			cancel()
			break
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: pgbouncer does not answer within 15s: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	direct := cfg.Copy()
	direct.User = role
	return Bouncer{URL: bouncerURL, Direct: *direct, Role: role}
}

// lockedBuffer is a bytes.Buffer that a process writes and a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
