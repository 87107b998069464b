package idemredis

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// redisAddr is the Redis the tests use: IDEMPOTENCY_TEST_REDIS_ADDR, default
// 127.0.0.1:6379. Each test writes under its own key prefix and deletes it
// when it ends; a test that flushes uses a database number of its own.
func redisAddr() string {
	if a := os.Getenv("IDEMPOTENCY_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// newRedisClient is a client as the package documents it: calls bounded by
// their context, no retries.
// clientLog holds go-redis's log lines ("failed to dial after 1 attempts",
// hundreds in a fault spec) for a failing test's log, out of stderr.
var (
	clientLog     = testdb.NewLineLog("go-redis")
	clientLogOnce sync.Once
)

// redisLog adapts clientLog to go-redis's logger.
type redisLog struct{ *testdb.LineLog }

func (l redisLog) Printf(_ context.Context, format string, v ...any) { l.LineLog.Printf(format, v...) }

// captureClientLog routes go-redis's log to clientLog, whose lines since
// now t logs if it fails. newRedisClient calls it; a test that makes its
// own client calls it first.
func captureClientLog(t testing.TB) {
	clientLogOnce.Do(func() { redis.SetLogger(redisLog{clientLog}) })
	clientLog.Watch(t)
}

func newRedisClient(t testing.TB, addr string, db int) *redis.Client {
	t.Helper()
	captureClientLog(t)
	rdb := redis.NewClient(&redis.Options{
		Addr: addr, DB: db, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// requireRedis skips (or, in CI, fails) the test when no Redis answers.
func requireRedis(t testing.TB) {
	t.Helper()
	rdb := newRedisClient(t, redisAddr(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		msg := "no Redis at " + redisAddr() + " (set IDEMPOTENCY_TEST_REDIS_ADDR, or start one): " + err.Error()
		if testdb.Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// testBundle is one order database, one Redis key prefix, and any number of
// service instances sharing both.
type testBundle struct {
	db     *sql.DB
	prefix string
	admin  *redis.Client // direct access to Redis, for planting and flushing
	rdbDB  int
}

func setup(t *testing.T, redisDB int) *testBundle {
	t.Helper()
	requireRedis(t)
	db, _ := testdb.MySQL(t)
	ctx := context.Background()
	require.NoError(t, idempotency.Migrate(ctx, db))
	_, err := db.ExecContext(ctx, `CREATE TABLE test_order (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		scope VARCHAR(255) NOT NULL,
		idem_key VARCHAR(255) NOT NULL,
		sku BIGINT NOT NULL,
		KEY (scope, idem_key))`) // not unique: a duplicate order must show, not fail
	require.NoError(t, err)

	var r [6]byte
	_, _ = rand.Read(r[:])
	b := &testBundle{db: db, prefix: "idemtest:" + hex.EncodeToString(r[:]) + ":", rdbDB: redisDB}
	b.admin = newRedisClient(t, redisAddr(), redisDB)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := b.admin.Scan(ctx, 0, b.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			b.admin.Del(ctx, iter.Val())
		}
	})
	return b
}

// testTimeout is the tests' Config.Timeout unless they set one: they run
// beside others on two cores, where a 20 ms deadline fails calls for want
// of CPU, not of Redis. The specs of the timeout itself set 20 ms.
const testTimeout = 250 * time.Millisecond

// newCache is a Cache over addr (the real Redis, or a proxy before it).
func (b *testBundle) newCache(t *testing.T, addr string, cfg Config) *Cache {
	t.Helper()
	cfg.Prefix = b.prefix
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	c, err := New(newRedisClient(t, addr, b.rdbDB), &cfg)
	require.NoError(t, err)
	return c
}

// instance is one service instance: a Middleware over the shared database
// (its replay cache off unless the test says otherwise) and the shared
// cache, served on loopback.
type instance struct {
	srv     *httptest.Server
	store   *countingStore
	shared  idempotency.SharedCache // nil without one
	runs    atomic.Int64            // handler executions
	release chan struct{}

	mu      sync.Mutex
	replays map[idempotency.ReplaySource]int // replayed answers by where they came from
}

// requireOffTheDatabase asserts that in made no store call, unless Redis
// failed or skipped one of its cache's calls: such a call is a miss by
// design (fail-open), and its request goes on to the database, which
// answers the same. On a starved machine a call can outlast the cache's
// timeout; that is the machine, not a fault.
func (in *instance) requireOffTheDatabase(t *testing.T, msg string) {
	t.Helper()
	if c, ok := in.shared.(*Cache); ok {
		if st := c.Stats(); st.Errors+st.Skipped > 0 {
			t.Logf("Redis failed %d calls and skipped %d (a loaded machine): %d store calls allowed", st.Errors, st.Skipped, in.store.storeCalls())
			return
		}
	}
	require.Zero(t, in.store.storeCalls(), "%s, though Redis answered every call", msg)
}

// replaysFrom counts the replayed answers that came from source.
func (in *instance) replaysFrom(source idempotency.ReplaySource) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.replays[source]
}

func (b *testBundle) newInstance(t *testing.T, shared idempotency.SharedCache, cfg idempotency.Config) *instance {
	t.Helper()
	if cfg.ReplayCacheBytes == 0 {
		cfg.ReplayCacheBytes = -1
	}
	if cfg.ScopeFunc == nil {
		cfg.ScopeFunc = func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }
	}
	if shared != nil {
		cfg.SharedCache = shared
	}
	in := &instance{store: &countingStore{Store: idempotency.NewMySQLStore(b.db)}, shared: shared, replays: map[idempotency.ReplaySource]int{}}
	if cfg.Observer == nil {
		cfg.Observer = idempotency.ObserverFunc(func(_ context.Context, e idempotency.Event) {
			if e.Final && e.Outcome == idempotency.OutcomeReplayed {
				in.mu.Lock()
				in.replays[e.From]++
				in.mu.Unlock()
			}
		})
	}
	mw, err := idempotency.New(in.store, &cfg)
	require.NoError(t, err)
	in.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(in.createOrder)))
	t.Cleanup(in.srv.Close)
	return in
}

// createOrder writes one order row in the request's transaction and answers
// 201 with its id; sku 0 is a business rejection (422), a negative sku a
// failure to retry (503). With release set, it waits for it first.
func (in *instance) createOrder(w http.ResponseWriter, r *http.Request) {
	in.runs.Add(1)
	if in.release != nil {
		<-in.release
	}
	var req struct{ SKU int64 }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if req.SKU < 0 { // not final: nothing is stored, the key is released
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":"try again"}`)
		return
	}
	if req.SKU == 0 {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, `{"error":"unknown sku"}`)
		return
	}
	tx, _ := idempotency.TxFromContext(r.Context())
	res, err := tx.ExecContext(r.Context(), "INSERT INTO test_order (scope, idem_key, sku) VALUES (?, ?, ?)",
		r.Header.Get("X-User"), r.Header.Get("Idempotency-Key"), req.SKU)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	id, _ := res.LastInsertId()
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%d}`, id)
}

// countingStore counts the store calls that a pre-filter hit must avoid.
type countingStore struct {
	idempotency.Store
	lookups, claims, inserts atomic.Int64
}

func (s *countingStore) Lookup(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	s.lookups.Add(1)
	return s.Store.Lookup(ctx, scope, key)
}

func (s *countingStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, c)
}

func (s *countingStore) InsertFinal(ctx context.Context, tx *sql.Tx, c idempotency.Claim, st idempotency.Status, snap *idempotency.Snapshot) error {
	s.inserts.Add(1)
	return s.Store.InsertFinal(ctx, tx, c, st, snap)
}

// storeCalls is every counted store call.
func (s *countingStore) storeCalls() int64 {
	return s.lookups.Load() + s.claims.Load() + s.inserts.Load()
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

func (a answer) problemType() string {
	var p struct{ Type string }
	_ = json.Unmarshal([]byte(a.body), &p)
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// post sends a create with user, key and sku to in.
func (in *instance) post(t *testing.T, user, key string, sku int) answer {
	t.Helper()
	a, err := in.tryPost(user, key, sku)
	require.NoError(t, err)
	return a
}

func (in *instance) tryPost(user, key string, sku int) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, in.srv.URL+"/orders", strings.NewReader(fmt.Sprintf(`{"sku":%d}`, sku)))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}, err
}

// orders counts the order rows of a key.
func (b *testBundle) orders(t *testing.T, user, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM test_order WHERE scope = ? AND idem_key = ?", user, key).Scan(&n))
	return n
}

// tcpProxy forwards loopback connections to a target. It can stop (its port
// refuses connections and every open one is cut, as when Redis stops), start
// again on the same port (Redis restarted, empty or not), or swallow
// everything without answering (Redis hung, or a network that drops
// packets).
type tcpProxy struct {
	target, addr string
	blackhole    atomic.Bool

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.stop)
	return p
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.link(c)
		}
	}()
}

func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tcpProxy) link(client net.Conn) {
	if !p.track(client) {
		client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(server) {
		client.Close()
		return
	}
	go func() {
		// While blackholed, requests are read and dropped: nothing reaches
		// Redis, so nothing comes back, on new and open connections alike.
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 && !p.blackhole.Load() {
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		server.Close()
	}()
	_, _ = io.Copy(client, server)
	client.Close()
}

// stop closes the port and cuts every connection.
func (p *tcpProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// restart listens on the same port again.
func (p *tcpProxy) restart(t *testing.T) {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err)
	p.serve(ln)
	p.awaitPong(t)
}

// awaitPong returns once a PING through the proxy is answered, so that the
// first call after a restart finds the path to Redis whole: the specs
// that restart it assert what the cache does once Redis is back, not how
// soon a loaded machine's loopback takes new connections again.
func (p *tcpProxy) awaitPong(t *testing.T) {
	t.Helper()
	var last error
	for range 50 {
		if last = pingThrough(p.addr); last == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the proxy at %s passes no PING to Redis after its restart: %v", p.addr, last)
}

func pingThrough(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "+PONG\r\n" {
		return fmt.Errorf("answered %q", buf)
	}
	return nil
}

// redisServer is a redis-server of the test's own on a loopback port of its
// own, which the test kills and starts again: a real restart (connections
// reset, the port refusing, the data gone) that leaves the shared Redis
// alone.
type redisServer struct {
	path, addr string
	cmd        *exec.Cmd
}

// startRedisServer starts a redis-server without persistence. It skips the
// test (or, in CI, fails it) when there is no redis-server to run.
func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if testdb.Required() {
			t.Fatal("no redis-server in PATH: " + err.Error())
		}
		t.Skip("no redis-server in PATH: " + err.Error())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &redisServer{path: path, addr: ln.Addr().String()}
	require.NoError(t, ln.Close())
	s.start(t)
	t.Cleanup(s.kill)
	return s
}

// start runs the server on its port and waits until it answers.
func (s *redisServer) start(t *testing.T) {
	t.Helper()
	_, port, _ := net.SplitHostPort(s.addr)
	s.cmd = exec.Command(s.path, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--protected-mode", "no")
	require.NoError(t, s.cmd.Start())
	rdb := newRedisClient(t, s.addr, 0)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return rdb.Ping(ctx).Err() == nil
	}, 10*time.Second, 20*time.Millisecond, "redis-server on %s did not start", s.addr)
}

// kill stops the server as a crash does (SIGKILL).
func (s *redisServer) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}
