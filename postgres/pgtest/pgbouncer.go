package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

	proc *bouncerProc
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
	proc := &bouncerProc{t: t, bin: bin, args: args}
	exited, err := proc.start()
	if err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		proc.stop()
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", proc.out.String())
		}
	})

	bouncerURL := (&url.URL{Scheme: "postgres", User: url.User(role), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/idem"}).String()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("pgtest: pgbouncer exited: %s", proc.out.String())
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
			t.Fatalf("pgtest: pgbouncer does not answer within 15s: %v\n%s", err, proc.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	direct := cfg.Copy()
	direct.User = role
	proc.supervise()
	return Bouncer{URL: bouncerURL, Direct: *direct, Role: role, proc: proc}
}

// Crashes is how many times PgBouncer exited on its own and was started
// again.
func (b Bouncer) Crashes() int {
	b.proc.mu.Lock()
	defer b.proc.mu.Unlock()
	return b.proc.crashes
}

// bouncerProc runs PgBouncer and, once supervised, starts it again on the
// same port when it exits on its own, as a service manager would
// (systemd's Restart=on-failure). Debian's PgBouncer 1.18 can exit with
// "FATAL ... disconnect_client(): bad client state: 0" when a cancel
// request's client connection ends before PgBouncer has forwarded it
// (pgbouncer/pgbouncer#801, fixed in a later release); pgx sends one for
// every connection it closes after an error, and a spec that cuts
// connections cuts those too. Each crash is logged to the test with the
// log's last line.
type bouncerProc struct {
	t    testing.TB
	bin  string
	args []string
	out  lockedBuffer

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	handled    chan struct{} // the exited process a restart was made for
	supervised bool
	stopping   bool
	crashes    int
}

// start starts PgBouncer and returns a channel closed when it exits.
func (p *bouncerProc) start() (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *bouncerProc) startLocked() (<-chan struct{}, error) {
	if p.stopping {
		return nil, errors.New("the test has ended")
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		_ = cmd.Wait()
		close(exited)
		p.exitedOnItsOwn(exited)
	}()
	return exited, nil
}

// supervise starts restarting PgBouncer when it exits on its own; before
// it, an exit fails PgBouncer's start.
func (p *bouncerProc) supervise() {
	p.mu.Lock()
	p.supervised = true
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		p.exitedOnItsOwn(exited)
	default:
	}
}

// maxBouncerCrashes bounds the restarts: a PgBouncer that cannot start at
// all must not be started again for the rest of the test.
const maxBouncerCrashes = 10

// exitedOnItsOwn starts PgBouncer again after the process behind exited
// ended, once per process, unless the test is stopping it. It holds mu
// throughout, so that nothing is logged once stop has begun (a log after
// the test ends panics).
func (p *bouncerProc) exitedOnItsOwn(exited chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping || !p.supervised || p.exited != exited || p.handled == exited {
		return
	}
	p.handled = exited
	p.crashes++
	last := lastLine(p.out.String())
	if p.crashes > maxBouncerCrashes {
		p.t.Logf("pgtest: pgbouncer exited on its own %d times, not starting it again; its last line: %s", p.crashes, last)
		return
	}
	p.t.Logf("pgtest: pgbouncer exited on its own (crash %d), starting it again; its last line: %s", p.crashes, last)
	if _, err := p.startLocked(); err != nil {
		p.t.Logf("pgtest: start pgbouncer again: %v", err)
	}
}

// stop ends PgBouncer for good.
func (p *bouncerProc) stop() {
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	<-exited
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
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
