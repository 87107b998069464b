package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/sqlite"
)

// Headers the simulated agent sends besides the API's own.
const (
	// headerCall names the tool call ("intent/call") an attempt belongs to;
	// the fault injector keys its latency draws on it.
	headerCall = "X-Sim-Call"
	// headerIntent is the intent id the Redis lock of strategy (c) is keyed
	// on, together with the user.
	headerIntent = "X-Intent-ID"
)

// simServer is the order service of one strategy, served on a real loopback
// listener, behind the fault injector.
type simServer struct {
	cfg      Config
	db       *sql.DB
	guard    http.Handler
	srv      *http.Server
	url      string
	arrivals sync.Map // call id → *atomic.Int64
	inflight sync.WaitGroup

	mu           sync.Mutex
	serverReplay []time.Duration // guard+handler time of replayed answers
}

// startServer opens a fresh database for st, builds the order service with
// st's guard and serves it on 127.0.0.1:0.
func startServer(ctx context.Context, cfg Config, st Strategy, rdb *redis.Client, tag string) (*simServer, error) {
	db, store, dialect, err := openFresh(ctx, cfg.DB, st.ID)
	if err != nil {
		return nil, err
	}
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("setup %s: %w", dialect, err)
	}
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: st.Idempotency,
		Store:       store,
		Config:      idempotency.Config{}, // the library's defaults
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &simServer{cfg: cfg, db: db, guard: svc}
	if st.Lock {
		s.guard = &redisLock{rdb: rdb, ttl: cfg.LockTTL, prefix: tag + ":" + st.ID, next: svc}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		return nil, err
	}
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// drain stops accepting, waits for every handler (including those whose
// caller timed out long ago: their work goes on, as in the incident) and
// leaves the database open for counting.
func (s *simServer) drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	s.inflight.Wait()
	return err
}

func (s *simServer) close() { s.db.Close() }

// ServeHTTP is the fault injector. Every create request gets a latency drawn
// for its (call, arrival) pair: usually short, with probability
// TimeoutRate longer than the gateway timeout. Part of it is spent before
// the guard (transport, gateway, queueing) and the rest after the guard and
// handler answered (the way back), so the database work itself stays short
// (SQLite has one writer) and every guard sees a request at the same moment.
// The handler runs detached from the caller: a gateway timeout does not stop
// the order service, which commits the order anyway.
func (s *simServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the caller is gone before the request was even read
	}
	r = r.WithContext(context.WithoutCancel(r.Context()))
	r.Body = io.NopCloser(bytes.NewReader(body))

	var pre, post time.Duration
	if r.Method == http.MethodPost && r.URL.Path == "/orders" {
		pre, post = s.latency(r.Header.Get(headerCall))
	}
	time.Sleep(pre)
	rec := httptest.NewRecorder()
	start := time.Now()
	s.guard.ServeHTTP(rec, r)
	took := time.Since(start)
	if rec.Header().Get("Idempotent-Replayed") == "true" {
		s.mu.Lock()
		s.serverReplay = append(s.serverReplay, took)
		s.mu.Unlock()
	}
	time.Sleep(post)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes()) // fails when the caller timed out: nobody reads it
}

// latency draws the delay of the n-th arrival of a call, deterministically
// from the seed, so every strategy meets the same faults on the same
// attempts.
func (s *simServer) latency(call string) (pre, post time.Duration) {
	v, _ := s.arrivals.LoadOrStore(call, new(atomic.Int64))
	n := v.(*atomic.Int64).Add(1)
	h := fnv.New64a()
	fmt.Fprintf(h, "%s#%d", call, n)
	rng := rand.New(rand.NewPCG(s.cfg.Seed^0x5eed_fa17, h.Sum64()))
	var total time.Duration
	if rng.Float64() < s.cfg.TimeoutRate {
		// A slow order: between OrderLatency and 1.2 × OrderLatency.
		total = s.cfg.OrderLatency + time.Duration(rng.Float64()*0.2*float64(s.cfg.OrderLatency))
	} else {
		// A normal one: exponential around BaseLatency, capped at 20×.
		total = min(time.Duration(rng.ExpFloat64()*float64(s.cfg.BaseLatency)), 20*s.cfg.BaseLatency)
	}
	pre = time.Duration(rng.Float64() * float64(total))
	return pre, total - pre
}

func (s *simServer) replayLatencies() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.serverReplay...)
}

// redisLock is strategy (c): a short-TTL SET NX lock keyed by user and
// intent in front of the unprotected handler. A request that finds the lock
// taken is answered like the middleware's in-progress (409, Retry-After: 1),
// so the only difference from (d) is what guards the key: a lock that
// expires after TTL instead of a durable record with a fingerprint. The
// lock is not released after the handler, which gives it its best case: it
// holds for the whole TTL.
type redisLock struct {
	rdb    *redis.Client
	ttl    time.Duration
	prefix string
	next   http.Handler
}

func (l *redisLock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/orders" {
		l.next.ServeHTTP(w, r)
		return
	}
	key := l.prefix + ":lock:" + r.Header.Get("X-User-ID") + ":" + r.Header.Get(headerIntent)
	ok, err := l.rdb.SetNX(r.Context(), key, "1", l.ttl).Result()
	if err != nil {
		p := idempotency.NewProblem(http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable, "Lock unavailable", err.Error())
		p.RetryAfter = 1
		idempotency.WriteProblem(w, p)
		return
	}
	if !ok {
		p := idempotency.NewProblem(http.StatusConflict, idempotency.ProblemInProgress, "Request in progress",
			"Another request for this intent holds the lock.")
		p.RetryAfter = 1
		idempotency.WriteProblem(w, p)
		return
	}
	l.next.ServeHTTP(w, r)
}

// openFresh opens an empty database for one strategy: a new SQLite file
// DIR/agentsim-<strategy>.db, or, on the MySQL server of DSN, the database
// <dbname>_agentsim_<strategy>, dropped and created anew. Both are left in
// place afterwards for inspection.
func openFresh(ctx context.Context, url, strategy string) (*sql.DB, idempotency.Store, string, error) {
	switch {
	case strings.HasPrefix(url, "sqlite://"):
		dir := strings.TrimPrefix(url, "sqlite://")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, "", err
		}
		path := filepath.Join(dir, "agentsim-"+strategy+".db")
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, nil, "", err
			}
		}
		db, err := sqlite.Open(path)
		if err != nil {
			return nil, nil, "", err
		}
		return db, sqlite.NewStore(db), "sqlite", nil
	case strings.HasPrefix(url, "mysql://"):
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(url, "mysql://"))
		if err != nil {
			return nil, nil, "", fmt.Errorf("-db: %w", err)
		}
		base := cfg.DBName
		if base == "" {
			base = "orderguard"
		}
		name := base + "_agentsim_" + strategy
		cfg.DBName = ""
		admin, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return nil, nil, "", err
		}
		defer admin.Close()
		for _, stmt := range []string{"DROP DATABASE IF EXISTS `" + name + "`", "CREATE DATABASE `" + name + "`"} {
			if _, err := admin.ExecContext(ctx, stmt); err != nil {
				return nil, nil, "", fmt.Errorf("-db: %s: %w", stmt, err)
			}
		}
		cfg.DBName = name
		db, err := orderservice.OpenMySQL(ctx, cfg)
		if err != nil {
			return nil, nil, "", err
		}
		return db, idempotency.NewMySQLStore(db), "mysql", nil
	default:
		return nil, nil, "", fmt.Errorf("-db %q: want sqlite://DIR or mysql://DSN", url)
	}
}
