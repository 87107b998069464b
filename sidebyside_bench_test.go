package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// BenchmarkSideBySide_NewKey measures new keys at concurrency 16 on
// MariaDB, every variant in the same run as the bare create: the variants
// take turns in slices of sideBySideDuration, so a slow spell of a shared
// machine falls on all of them, each round starting with the next. One op
// is one round of slices:
//
//	go test -run '^$' -bench SideBySide -benchtime 5x
//
// IDEMPOTENCY_SIDE_BY_SIDE, a comma-separated list of variant names,
// keeps only those beside the bare create.
//
// It reports each variant's requests per second, its ratio to the bare
// create on go-sql-driver's own pool ("…/bare"), and this process's CPU
// time per request (load generator, middleware, driver: a figure the
// machine's other load disturbs less than throughput). Each variant has a
// pool of its own. The order service's create
// is BEGIN, a SELECT, an INSERT and COMMIT; the middleware adds the
// record's statement (single-phase; none of its own on OpenMySQL's pool,
// where it travels with the COMMIT) or the claim and the finish
// (claim-first, the same on either pool).
func BenchmarkSideBySide_NewKey(b *testing.B) {
	plain, dsn := testdb.MySQL(b)
	if err := orderservice.Setup(context.Background(), plain, "mysql"); err != nil {
		b.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		b.Fatal(err)
	}
	// Each variant has a pool of its own, opened as an application would.
	pool := func(batched bool) *sql.DB {
		var db *sql.DB
		if batched {
			db, err = idempotency.OpenMySQL(cfg)
		} else {
			var c driver.Connector
			if c, err = mysql.NewConnector(cfg); err == nil {
				db = sql.OpenDB(c)
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(80)
		db.SetMaxIdleConns(80)
		b.Cleanup(func() { db.Close() })
		return db
	}

	type variant struct {
		name string
		h    http.Handler
		key  bool
		done atomic.Int64
		cpu  time.Duration // this process's CPU time in the variant's slices
		db   time.Duration // the database server's, when it runs here
	}
	service := func(batched, protect bool, mode idempotency.Mode) http.Handler {
		db := pool(batched)
		svc, err := orderservice.New(db, orderservice.Options{
			Idempotency: protect, Store: idempotency.NewMySQLStore(db), Config: idempotency.Config{Mode: mode},
		})
		if err != nil {
			b.Fatal(err)
		}
		return svc
	}
	variants := []*variant{
		{name: "bare", h: service(false, false, 0)},
		{name: "bare-OpenMySQL", h: service(true, false, 0)},
		{name: "single-phase", h: service(false, true, idempotency.ModeSinglePhase), key: true},
		{name: "single-phase-OpenMySQL", h: service(true, true, idempotency.ModeSinglePhase), key: true},
		{name: "claim-first", h: service(false, true, idempotency.ModeClaimFirst), key: true},
		{name: "claim-first-OpenMySQL", h: service(true, true, idempotency.ModeClaimFirst), key: true},
	}
	if only := os.Getenv("IDEMPOTENCY_SIDE_BY_SIDE"); only != "" {
		keep := strings.Split(only, ",")
		variants = slices.DeleteFunc(variants, func(v *variant) bool { return v.name != "bare" && !slices.Contains(keep, v.name) })
	}
	var elapsed = map[string]time.Duration{}
	for i := 0; i < b.N; i++ {
		// Each round starts with the next variant: no variant always
		// follows the same one.
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			start, cpu, db := time.Now(), processCPU(), serverCPU()
			v.done.Add(sideBySideSlice(b, v.h, v.key))
			elapsed[v.name] += time.Since(start)
			v.cpu += processCPU() - cpu
			v.db += serverCPU() - db
		}
	}
	bare := float64(variants[0].done.Load()) / elapsed["bare"].Seconds()
	for _, v := range variants {
		rate := float64(v.done.Load()) / elapsed[v.name].Seconds()
		b.ReportMetric(rate, v.name+"-req/s")
		b.ReportMetric(rate/bare, v.name+"/bare")
		b.ReportMetric(float64(v.cpu.Microseconds())/float64(v.done.Load()), v.name+"-cpu-µs/req")
		if v.db > 0 {
			b.ReportMetric(float64(v.db.Microseconds())/float64(v.done.Load()), v.name+"-db-cpu-µs/req")
		}
	}
}

// serverCPU is the CPU time so far of a MariaDB or MySQL server running on
// this machine (all of it: other clients' work too, which the slices'
// rotation spreads over the variants), or 0.
func serverCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || (string(comm) != "mariadbd\n" && string(comm) != "mysqld\n") {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			return 0
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th, in clock ticks (100 a second).
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 13 {
			return 0
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return 0
}

// processCPU is this process's CPU time so far (user and system): the load
// generator's, the middleware's and the driver's, not the database's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sideBySideConcurrency and sideBySideDuration shape one slice.
const (
	sideBySideConcurrency = 16
	sideBySideDuration    = time.Second
)

// sideBySideSlice runs h with sideBySideConcurrency workers for
// sideBySideDuration, each request a create (with a fresh key if key), and
// returns how many were answered 201.
func sideBySideSlice(b *testing.B, h http.Handler, key bool) int64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(sideBySideDuration)
	for range sideBySideConcurrency {
		wg.Go(func() {
			w := &benchWriter{header: http.Header{}}
			rd := bytes.NewReader(nil)
			for time.Now().Before(stop) {
				r := benchRequest("")
				if key {
					r.Header["Idempotency-Key"] = []string{benchFreshKey()}
				}
				rd.Reset(benchBody)
				r.Body = io.NopCloser(rd)
				w.reset()
				h.ServeHTTP(w, r)
				if w.status != http.StatusCreated {
					b.Error(fmt.Sprintf("status %d", w.status))
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load()
}
