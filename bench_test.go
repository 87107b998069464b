package idempotency_test

// Benchmarks of the middleware's in-process path, for ns/op, B/op and
// allocs/op (go test -run='^$' -bench=. -benchmem; cmd/idembench runs them
// and puts the lines in docs/benchmarks.md).
//
// Two back ends:
//
//   - FakeStore: an in-memory idempotency.Store (benchStore, below; a fake
//     used ONLY in these benchmarks, never to test behaviour) whose
//     transactions come from a database/sql driver that does nothing. The
//     handler is a minimal create that writes a fixed 201. This isolates the
//     middleware's own work: compare with FakeStore/no-middleware, the same
//     handler in a plain transaction.
//   - MariaDB: the example order service over the real MySQL store and a
//     fresh database from internal/testdb (skipped when no server is
//     reachable), called through ServeHTTP without a network: every
//     allocation of middleware, store, driver and handler is counted.
//
// Each iteration builds its request from a template (a shallow copy, a new
// key where needed, a body reader), as a server would; those few
// allocations are in every variant, no-middleware included.

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

func BenchmarkMiddleware_FirstRequest(b *testing.B) {
	b.Run("FakeStore", func(b *testing.B) {
		store := newBenchStore()
		b.Run("no-middleware", func(b *testing.B) {
			h := benchPlainTx(store.db, http.HandlerFunc(benchCreated))
			benchServe(b, h, benchRequest(""), nil, http.StatusCreated)
		})
		for _, mode := range benchModes {
			b.Run(mode.name, func(b *testing.B) {
				h := benchMiddleware(b, store, idempotency.Config{Mode: mode.mode}).Handler(http.HandlerFunc(benchCreated))
				benchServe(b, h, benchRequest("k"), benchFreshKey, http.StatusCreated)
			})
		}
	})
	b.Run("MariaDB", func(b *testing.B) {
		db := benchMariaDB(b)
		b.Run("no-middleware", func(b *testing.B) {
			benchServe(b, benchOrderService(b, db, false, idempotency.Config{}), benchRequest(""), nil, http.StatusCreated)
		})
		for _, mode := range benchModes {
			b.Run(mode.name, func(b *testing.B) {
				svc := benchOrderService(b, db, true, idempotency.Config{Mode: mode.mode})
				benchServe(b, svc, benchRequest("k"), benchFreshKey, http.StatusCreated)
			})
		}
	})
}

func BenchmarkMiddleware_Replay(b *testing.B) {
	variants := []struct {
		name string
		cfg  idempotency.Config
	}{
		{"cache-on", idempotency.Config{}},
		{"cache-off/claim-first", idempotency.Config{Mode: idempotency.ModeClaimFirst, ReplayCacheBytes: -1}},
		{"cache-off/single-phase", idempotency.Config{Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1}},
	}
	b.Run("FakeStore", func(b *testing.B) {
		store := newBenchStore()
		for _, v := range variants {
			b.Run(v.name, func(b *testing.B) {
				h := benchMiddleware(b, store, v.cfg).Handler(http.HandlerFunc(benchCreated))
				req := benchRequest(benchFreshKey())
				benchServe(b, h, req, nil, http.StatusCreated) // the first one creates the record
			})
		}
	})
	b.Run("MariaDB", func(b *testing.B) {
		db := benchMariaDB(b)
		for _, v := range variants {
			b.Run(v.name, func(b *testing.B) {
				svc := benchOrderService(b, db, true, v.cfg)
				benchServe(b, svc, benchRequest(benchFreshKey()), nil, http.StatusCreated)
			})
		}
	})
}

var benchModes = []struct {
	name string
	mode idempotency.Mode
}{
	{"claim-first", idempotency.ModeClaimFirst},
	{"single-phase", idempotency.ModeSinglePhase},
}

// benchServe calls h once per iteration with a request made from tmpl; key,
// if not nil, gives each request a fresh Idempotency-Key.
func benchServe(b *testing.B, h http.Handler, tmpl *http.Request, key func() string, want int) {
	b.Helper()
	body := benchBody
	w := &benchWriter{header: http.Header{}}
	hdr := tmpl.Header
	keySlot := hdr["Idempotency-Key"]
	rd := bytes.NewReader(body)
	serve := func() {
		if key != nil {
			keySlot[0] = key()
		}
		rd.Reset(body)
		r := new(http.Request)
		*r = *tmpl
		r.Body = io.NopCloser(rd)
		w.reset()
		h.ServeHTTP(w, r)
		if w.status != want {
			b.Fatalf("status %d, want %d", w.status, want)
		}
	}
	serve() // untimed: a replay's first request creates the record it replays
	b.ReportAllocs()
	for b.Loop() {
		serve()
	}
}

var (
	benchBody      = []byte(`{"user_id":7,"sku_id":20001,"quantity":1}`)
	benchOrderBody = []byte(`{"order_no":"O20260101a1b2c3d4e5f60718","status":"CREATED","user_id":7,"sku_id":20001,"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000}` + "\n")
	benchJSON      = []string{"application/json"}
	benchLocation  = []string{"/orders/O20260101a1b2c3d4e5f60718"}
	benchKeyPrefix = func() string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return "bench-" + hex.EncodeToString(b[:]) + "-"
	}()
	benchKeySeq atomic.Int64
)

// benchFreshKey is a key never used before in this process (or, by its
// random prefix, in the database).
func benchFreshKey() string {
	return benchKeyPrefix + strconv.FormatInt(benchKeySeq.Add(1), 10)
}

// benchRequest is a POST /orders template for user 7; key "" sends none, "k"
// reserves a slot that benchServe fills with a fresh key.
func benchRequest(key string) *http.Request {
	r, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://bench/orders", nil)
	if err != nil {
		panic(err)
	}
	r.RequestURI = "/orders"
	r.Header = http.Header{"Content-Type": benchJSON, "X-User-Id": {"7"}}
	if key != "" {
		r.Header["Idempotency-Key"] = []string{key}
	}
	r.ContentLength = int64(len(benchBody))
	return r
}

// benchCreated is a minimal create handler: it reads the body and answers
// a fixed 201.
func benchCreated(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	h["Content-Type"] = benchJSON
	h["Location"] = benchLocation
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(benchOrderBody)
}

// benchPlainTx runs next in a plain transaction, committed after it: the
// no-middleware reference.
func benchPlainTx(db *sql.DB, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		next.ServeHTTP(w, r)
		_ = tx.Commit()
	})
}

func benchMiddleware(b *testing.B, store idempotency.Store, cfg idempotency.Config) *idempotency.Middleware {
	b.Helper()
	cfg.ScopeFunc = func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }
	mw, err := idempotency.New(store, &cfg)
	if err != nil {
		b.Fatal(err)
	}
	return mw
}

// benchWriter is a ResponseWriter that keeps the status and discards the
// body, reusing its header map.
type benchWriter struct {
	header http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.n += len(p)
	return len(p), nil
}
func (w *benchWriter) reset() {
	clear(w.header)
	w.status, w.n = 0, 0
}

// benchMariaDB is a fresh MariaDB database with the order schema, shared by
// one benchmark's sub-benchmarks; it skips the benchmark without a server.
func benchMariaDB(b *testing.B) *sql.DB {
	b.Helper()
	db, _ := testdb.MySQL(b)
	if err := orderservice.Setup(context.Background(), db, "mysql"); err != nil {
		b.Fatal(err)
	}
	return db
}

func benchOrderService(b *testing.B, db *sql.DB, protect bool, cfg idempotency.Config) http.Handler {
	b.Helper()
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: protect, Store: idempotency.NewMySQLStore(db), Config: cfg,
	})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// benchStore is an in-memory idempotency.Store for benchmarks only: records
// live in a map, transactions come from benchNopConnector. It implements the
// methods a first request and a replay use; the embedded (nil) Store makes
// any other method panic, so a path that needs one shows up at once.
type benchStore struct {
	idempotency.Store
	db   *sql.DB
	mu   sync.Mutex
	recs map[string]*idempotency.Record
}

func newBenchStore() *benchStore {
	return &benchStore{db: sql.OpenDB(benchNopConnector{}), recs: map[string]*idempotency.Record{}}
}

func benchID(scope, key string) string { return scope + "\x00" + key }

func (s *benchStore) Claim(_ context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := benchID(c.Scope, c.Key)
	if _, ok := s.recs[id]; ok {
		return idempotency.Lease{}, idempotency.ErrKeyClaimed
	}
	now := time.Now()
	s.recs[id] = &idempotency.Record{Scope: c.Scope, Key: c.Key, Fingerprint: c.Fingerprint,
		Status: idempotency.StatusProcessing, Owner: c.Owner, Version: 1,
		CreatedAt: now, UpdatedAt: now, LockedUntil: now.Add(c.Lease), ExpiresAt: now.Add(c.Retention)}
	return idempotency.Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: 1}, nil
}

func (s *benchStore) Lookup(_ context.Context, scope, key string) (*idempotency.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[benchID(scope, key)]
	if !ok {
		return nil, idempotency.ErrRecordNotFound
	}
	cp := *rec // a store returns a fresh record per read
	cp.ReadAt = time.Now()
	return &cp, nil
}

func (s *benchStore) BeginTx(ctx context.Context) (*sql.Tx, error) { return s.db.BeginTx(ctx, nil) }

func (s *benchStore) finish(l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[benchID(l.Scope, l.Key)]
	if !ok || rec.Owner != l.Owner || rec.Version != l.Version || rec.Status != idempotency.StatusProcessing {
		return idempotency.Lease{}, idempotency.ErrLeaseLost
	}
	now := time.Now()
	rec.Status, rec.Snapshot, rec.Version = st, snap, rec.Version+1
	rec.LockedUntil, rec.UpdatedAt, rec.ExpiresAt = time.Time{}, now, now.Add(retention)
	l.Version++
	return l, nil
}

func (s *benchStore) FinishTx(_ context.Context, _ *sql.Tx, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	return s.finish(l, st, snap, retention)
}

func (s *benchStore) Finish(_ context.Context, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	return s.finish(l, st, snap, retention)
}

func (s *benchStore) Release(_ context.Context, l idempotency.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, benchID(l.Scope, l.Key))
	return nil
}

func (s *benchStore) InsertFinal(_ context.Context, _ *sql.Tx, c idempotency.Claim, st idempotency.Status, snap *idempotency.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := benchID(c.Scope, c.Key)
	if _, ok := s.recs[id]; ok {
		return idempotency.ErrKeyClaimed
	}
	now := time.Now()
	s.recs[id] = &idempotency.Record{Scope: c.Scope, Key: c.Key, Fingerprint: c.Fingerprint,
		Status: st, Owner: c.Owner, Version: 1, Snapshot: snap,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(c.Retention)}
	return nil
}

// benchNopConnector is a database/sql driver whose transactions do nothing:
// it gives benchStore real *sql.Tx values at the cost of database/sql alone.
type benchNopConnector struct{}

func (benchNopConnector) Connect(context.Context) (driver.Conn, error) { return benchNopConn{}, nil }
func (benchNopConnector) Driver() driver.Driver                        { return benchNopDriver{} }

type benchNopDriver struct{}

func (benchNopDriver) Open(string) (driver.Conn, error) { return benchNopConn{}, nil }

type benchNopConn struct{}

func (benchNopConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("benchNopConn: no statements")
}
func (benchNopConn) Close() error              { return nil }
func (benchNopConn) Begin() (driver.Tx, error) { return benchNopConn{}, nil }
func (benchNopConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return benchNopConn{}, nil
}
func (benchNopConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1), nil
}
func (benchNopConn) Commit() error   { return nil }
func (benchNopConn) Rollback() error { return nil }
