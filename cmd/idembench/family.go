package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/sqlite"
)

// family is one database with the order schema, and the in-process servers
// that serve the order handlers over it on loopback.
type family struct {
	name    string // "mariadb", "postgres" or "sqlite"
	dialect string // orderservice.Setup dialect
	db      *sql.DB
	store   idempotency.Store
	client  *http.Client
	probe   func() map[string]float64
	// openDB opens another pool to the family's database, as another
	// instance of the service would (MariaDB only; nil elsewhere).
	openDB func() *sql.DB

	cleanup []func()
}

// openMariaDB creates a fresh database idembench_<random>_<label> on the
// server of dsn and opens it as examples/server does (interpolateParams,
// parseTime, a pool of 64). The database is dropped by close.
func openMariaDB(ctx context.Context, dsn, label string) (*family, error) {
	base, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("-mysql: %w", err)
	}
	admin, err := sql.Open("mysql", base.FormatDSN())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := admin.PingContext(pctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("MariaDB at %s: %w", base.Addr, err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "idembench_" + hex.EncodeToString(b[:]) + "_" + label
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4"); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	f := &family{name: "mariadb", dialect: "mysql"}
	f.cleanup = append(f.cleanup, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			fmt.Fprintf(os.Stderr, "idembench: drop database %s: %v\n", name, err)
		}
		admin.Close()
	})
	cfg := base.Clone()
	cfg.DBName = name
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	cfg.AllowAllFiles = false
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		f.close()
		return nil, err
	}
	counts := &sqlCounts{}
	f.openDB = func() *sql.DB {
		db := sql.OpenDB(countingConnector{Connector: connector, n: counts})
		db.SetMaxOpenConns(64)
		db.SetMaxIdleConns(64)
		db.SetConnMaxLifetime(time.Hour)
		f.cleanup = append(f.cleanup, func() { db.Close() })
		return db
	}
	db := f.openDB()
	f.db = db
	if err := orderservice.Setup(ctx, db, "mysql"); err != nil {
		f.close()
		return nil, fmt.Errorf("setup %s: %w", name, err)
	}
	f.store = idempotency.NewMySQLStore(db)
	f.client = newClient(64)
	f.probe = mariaProbe(admin, counts)
	return f, nil
}

// openSQLite creates a fresh SQLite file in a temporary directory.
func openSQLite(ctx context.Context) (*family, error) {
	dir, err := os.MkdirTemp("", "idembench-sqlite")
	if err != nil {
		return nil, err
	}
	f := &family{name: "sqlite", dialect: "sqlite"}
	f.cleanup = append(f.cleanup, func() { os.RemoveAll(dir) })
	db, err := sqlite.Open(filepath.Join(dir, "idembench.db"))
	if err != nil {
		f.close()
		return nil, err
	}
	f.db = db
	f.cleanup = append(f.cleanup, func() { db.Close() })
	if err := orderservice.Setup(ctx, db, "sqlite"); err != nil {
		f.close()
		return nil, fmt.Errorf("setup sqlite: %w", err)
	}
	f.store = sqlite.NewStore(db)
	f.client = newClient(64)
	f.probe = cpuProbe(nil)
	return f, nil
}

func (f *family) close() {
	for i := len(f.cleanup) - 1; i >= 0; i-- {
		f.cleanup[i]()
	}
	f.cleanup = nil
}

// serveHTTP serves h on 127.0.0.1:0 with net/http until the family closes,
// and returns the URL of POST /orders.
func (f *family) serveHTTP(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	f.cleanup = append(f.cleanup, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String() + "/orders", nil
}

// service serves the example order service with opts (Store and Dialect are
// filled in) and returns the URL of POST /orders.
func (f *family) service(opts orderservice.Options) (string, error) {
	if opts.Idempotency {
		opts.Store = f.store
	}
	opts.Dialect = f.dialect
	svc, err := orderservice.New(f.db, opts)
	if err != nil {
		return "", err
	}
	return f.serveHTTP(svc)
}

// baselineTarget is B0: the create transaction without the middleware.
func (f *family) baselineTarget() (target, error) {
	url, err := f.service(orderservice.Options{Idempotency: false})
	return target{url: url, gen: genBaseline, wantStatus: http.StatusCreated}, err
}

// firstTarget is B1: a new key per request through the middleware.
func (f *family) firstTarget(cfg idempotency.Config) (target, error) {
	url, err := f.service(orderservice.Options{Idempotency: true, Config: cfg})
	return target{url: url, keyHeader: "Idempotency-Key", gen: genNewKey, wantStatus: http.StatusCreated}, err
}

// replayTarget is B2: replays of pool round-robin.
func (f *family) replayTarget(cfg idempotency.Config, pool []poolEntry) (target, error) {
	url, err := f.service(orderservice.Options{Idempotency: true, Config: cfg})
	return target{url: url, keyHeader: "Idempotency-Key", gen: genReplay(pool),
		wantStatus: http.StatusCreated, wantReplayed: true}, err
}

// countOrders counts the purchase_order rows of one key: the executions.
func (f *family) countOrders(ctx context.Context, scope, key string) (int, error) {
	q := `SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ?`
	if f.dialect == "postgres" {
		q = `SELECT COUNT(*) FROM purchase_order WHERE scope = $1 AND idempotency_key = $2`
	}
	var n int
	err := f.db.QueryRowContext(ctx, q, scope, key).Scan(&n)
	return n, err
}

// mariaProbe reads what says where a request's time goes: this process's
// round trips to the database (counted client-side), the server's counters
// (statements, fsyncs, buffer-pool misses, row-lock waits: global, so
// anything else running on the server adds to them), and the CPU time of
// this process and of mariadbd.
func mariaProbe(admin *sql.DB, counts *sqlCounts) func() map[string]float64 {
	vars := map[string]string{
		"Questions":                "server_stmts",
		"Com_commit":               "commits",
		"Innodb_data_fsyncs":       "fsyncs",
		"Innodb_buffer_pool_reads": "bp_disk_reads",
		"Innodb_row_lock_waits":    "row_lock_waits",
	}
	cpu := cpuProbe(map[string]string{"cpu_db": "mariadbd"})
	return func() map[string]float64 {
		out := cpu()
		for k, v := range counts.snapshot() {
			out[k] = v
		}
		rows, err := admin.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions','Com_commit','Innodb_data_fsyncs','Innodb_buffer_pool_reads','Innodb_row_lock_waits')")
		if err != nil {
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var name, value string
			if rows.Scan(&name, &value) != nil {
				continue
			}
			if label := vars[name]; label != "" {
				v, _ := strconv.ParseFloat(value, 64)
				out[label] = v
			}
		}
		return out
	}
}

// cpuProbe returns the CPU seconds used so far by this process (cpu_self) and
// by the named other processes (label → comm), read from /proc.
func cpuProbe(others map[string]string) func() map[string]float64 {
	pids := map[string]int{}
	for label, comm := range others {
		if pid := findProcess(comm); pid > 0 {
			pids[label] = pid
		}
	}
	return func() map[string]float64 {
		out := map[string]float64{"cpu_self": procCPU("self"), "cpu_total": machineBusyCPU()}
		for label, pid := range pids {
			out[label] = procCPU(strconv.Itoa(pid))
		}
		return out
	}
}

// procCPU is utime+stime of /proc/<pid>/stat in seconds (USER_HZ = 100).
func procCPU(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	fields := strings.Fields(s)
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100
}

// machineBusyCPU is the CPU seconds all cores spent busy so far (/proc/stat:
// everything but idle and iowait).
func machineBusyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	var busy float64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		busy += v
	}
	return busy / 100
}

// findProcess returns the pid of the first process whose comm is name.
func findProcess(name string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == name {
			return pid
		}
	}
	return 0
}

var errB3 = errors.New("B3: a key executed other than exactly once")
