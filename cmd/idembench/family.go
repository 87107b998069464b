package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	name := databaseName(label)
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
	connector, err := mariaConnector(base, name)
	if err != nil {
		f.close()
		return nil, err
	}
	counts := &sqlCounts{}
	f.openDB = func() *sql.DB { return f.openPool(connector, counts) }
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

// mariaConnector connects to database name on the server of base as
// examples/server does (interpolateParams, parseTime).
func mariaConnector(base *mysql.Config, name string) (driver.Connector, error) {
	cfg := base.Clone()
	cfg.DBName, cfg.InterpolateParams, cfg.ParseTime, cfg.AllowAllFiles = name, true, true, false
	return mysql.NewConnector(cfg)
}

// openPool opens a pool of 64 connections on connector, as examples/server
// does, counting its statements in counts; close closes it.
func (f *family) openPool(connector driver.Connector, counts *sqlCounts) *sql.DB {
	db := sql.OpenDB(countingConnector{Connector: connector, n: counts})
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	db.SetConnMaxLifetime(time.Hour)
	f.cleanup = append(f.cleanup, func() { db.Close() })
	return db
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

// httpFrontEnd is a frontEnd over net/http (service).
func (f *family) httpFrontEnd(opts orderservice.Options, gen generator, replays bool) (target, error) {
	url, err := f.service(opts)
	t := target{url: url, gen: gen, wantStatus: http.StatusCreated, wantReplayed: replays}
	if opts.Idempotency {
		t.keyHeader = "Idempotency-Key"
	}
	return t, err
}

// baselineTarget is B0: the create transaction without the middleware.
func (f *family) baselineTarget() (target, error) {
	return f.httpFrontEnd(orderservice.Options{}, genBaseline, false)
}

// firstTarget is B1: a new key per request through the middleware.
func (f *family) firstTarget(cfg idempotency.Config) (target, error) {
	return f.httpFrontEnd(orderservice.Options{Idempotency: true, Config: cfg}, genNewKey, false)
}

// replayTarget is B2: replays of pool round-robin.
func (f *family) replayTarget(cfg idempotency.Config, pool []poolEntry) (target, error) {
	return f.httpFrontEnd(orderservice.Options{Idempotency: true, Config: cfg}, genReplay(pool), true)
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

// databaseName is a fresh database name: idembench_<random>_<label>.
func databaseName(label string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "idembench_" + hex.EncodeToString(b[:]) + "_" + label
}
