package idemredis

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// BenchmarkSideBySide_NewKeyWithRedis measures new keys at concurrency 16
// on MariaDB, each mode without Redis, with it (two calls a request:
// MarkUnlessReplay, PutReplayAndUnmark), with the four calls a request
// made before (GetReplay, MarkInFlight, PutReplay, UnmarkInFlight, through
// fourCalls), and with two PINGs in their place (twoPings: the floor of two
// round trips), in the same run: the variants take turns in slices of a
// second, each round starting with the next. One op is one round:
//
//	go test -run '^$' -bench SideBySide -benchtime 10x
//
// It reports each variant's requests per second and its ratio to the same
// mode without Redis ("…/no-redis").
func BenchmarkSideBySide_NewKeyWithRedis(b *testing.B) {
	requireRedis(b)
	db, _ := testdb.MySQL(b)
	if err := orderservice.Setup(context.Background(), db, "mysql"); err != nil {
		b.Fatal(err)
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	prefix := "idembench-test:" + hex.EncodeToString(r[:]) + ":"
	client := newRedisClient(b, redisAddr(), 0)
	cache, err := New(client, &Config{Prefix: prefix, Timeout: testTimeout})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	type variant struct {
		name, base string
		h          http.Handler
		done       atomic.Int64
		elapsed    time.Duration
		cpu        time.Duration // this process's CPU time in the variant's slices
	}
	service := func(mode idempotency.Mode, shared idempotency.SharedCache) http.Handler {
		cfg := idempotency.Config{Mode: mode}
		if shared != nil {
			cfg.SharedCache = shared
		}
		svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: idempotency.NewMySQLStore(db), Config: cfg})
		if err != nil {
			b.Fatal(err)
		}
		return svc
	}
	var variants []*variant
	for _, mode := range []idempotency.Mode{idempotency.ModeSinglePhase, idempotency.ModeClaimFirst} {
		base := mode.String() + "/no-redis"
		variants = append(variants,
			&variant{name: base, base: base, h: service(mode, nil)},
			&variant{name: mode.String() + "/redis", base: base, h: service(mode, cache)},
			&variant{name: mode.String() + "/redis-4-calls", base: base, h: service(mode, fourCalls{cache})},
			&variant{name: mode.String() + "/two-pings", base: base, h: service(mode, twoPings{cache})},
		)
	}
	for i := 0; i < b.N; i++ {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			start, cpu := time.Now(), processCPU()
			v.done.Add(redisSlice(b, v.h))
			v.elapsed += time.Since(start)
			v.cpu += processCPU() - cpu
		}
	}
	rates := map[string]float64{}
	for _, v := range variants {
		rates[v.name] = float64(v.done.Load()) / v.elapsed.Seconds()
	}
	for _, v := range variants {
		b.ReportMetric(rates[v.name], v.name+"-req/s")
		b.ReportMetric(rates[v.name]/rates[v.base], v.name+"/no-redis")
		b.ReportMetric(float64(v.cpu.Microseconds())/float64(v.done.Load()), v.name+"-cpu-µs/req")
	}
	st := cache.Stats()
	b.Logf("Redis: %d calls failed or timed out, %d skipped, %d times down", st.Errors, st.Skipped, st.Downs)
}

// processCPU is this process's CPU time so far (user and system): the load
// generator's, the middleware's and the clients', not Redis's or the
// database's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fourCalls is the Cache as the middleware used it before
// MarkUnlessReplay and PutReplayAndUnmark: two calls each.
type fourCalls struct{ *Cache }

func (f fourCalls) MarkUnlessReplay(ctx context.Context, m idempotency.InFlightMarker, ttl time.Duration) (*idempotency.Record, time.Duration, *idempotency.InFlightMarker, bool) {
	if rec, recTTL := f.GetReplay(ctx, m.Scope, m.Key); rec != nil {
		return rec, recTTL, nil, false
	}
	held, set := f.MarkInFlight(ctx, m, ttl)
	return nil, 0, held, set
}

func (f fourCalls) PutReplayAndUnmark(ctx context.Context, rec *idempotency.Record, ttl time.Duration, m idempotency.InFlightMarker) {
	if rec != nil {
		f.PutReplay(ctx, rec, ttl)
	}
	f.UnmarkInFlight(ctx, m)
}

// twoPings is the floor of two calls a request: a PING where the Cache
// sends MarkUnlessReplay's script and another where it sends
// PutReplayAndUnmark's, with no replay found, nothing marked and nothing
// stored. Two round trips to Redis, and Redis's cheapest command, on the
// same cores as the rest.
type twoPings struct{ *Cache }

func (p twoPings) MarkUnlessReplay(ctx context.Context, _ idempotency.InFlightMarker, _ time.Duration) (*idempotency.Record, time.Duration, *idempotency.InFlightMarker, bool) {
	p.client.Ping(ctx)
	return nil, 0, nil, true
}

func (p twoPings) PutReplayAndUnmark(ctx context.Context, _ *idempotency.Record, _ time.Duration, _ idempotency.InFlightMarker) {
	p.client.Ping(ctx)
}

var benchKeys atomic.Int64

// redisSlice runs h with 16 workers for a second, each request a create
// with a fresh key, and returns how many were answered 201.
func redisSlice(b *testing.B, h http.Handler) int64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(time.Second)
	body := []byte(`{"user_id":7,"sku_id":20001,"quantity":1}`)
	for range 16 {
		wg.Go(func() {
			rd := bytes.NewReader(nil)
			for time.Now().Before(stop) {
				rd.Reset(body)
				r, _ := http.NewRequest(http.MethodPost, "http://bench/orders", io.NopCloser(rd))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("X-User-Id", "7")
				r.Header.Set("Idempotency-Key", fmt.Sprint("k-", benchKeys.Add(1)))
				w := &statusWriter{header: http.Header{}}
				h.ServeHTTP(w, r)
				if w.status != http.StatusCreated {
					b.Errorf("status %d", w.status)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load()
}

type statusWriter struct {
	header http.Header
	status int
}

func (w *statusWriter) Header() http.Header { return w.header }
func (w *statusWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}
