package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"maps"
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
	openDB func() (*sql.DB, error)
	// plainMySQL opens MariaDB pools on the driver's own connector, as
	// sql.Open does, instead of idempotency.OpenMySQL's (-mysql-batch=false).
	plainMySQL bool

	cleanup []func()
}

// openMariaDB creates a fresh database idembench_<random>_<label> on the
// server of dsn and opens it with examples/server's pool settings on
// idempotency.OpenMySQL's connector (mariaPool). The database is dropped by
// close.
func openMariaDB(ctx context.Context, dsn, label string, plain bool) (*family, error) {
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
	f := &family{name: "mariadb", dialect: "mysql", plainMySQL: plain}
	f.cleanup = append(f.cleanup, func() { admin.Close() })
	name := databaseName(label)
	if err := f.createDatabase(ctx, admin, name, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4", "DROP DATABASE IF EXISTS "+name); err != nil {
		f.close()
		return nil, err
	}
	counts := &sqlCounts{}
	f.openDB = func() (*sql.DB, error) { return f.mariaPool(base, name, counts) }
	if f.db, err = f.openDB(); err != nil {
		f.close()
		return nil, err
	}
	if err := orderservice.Setup(ctx, f.db, "mysql"); err != nil {
		f.close()
		return nil, fmt.Errorf("setup %s: %w", name, err)
	}
	f.store = idempotency.NewMySQLStore(f.db)
	f.client = newClient(64)
	f.probe = mariaProbe(admin, counts)
	return f, nil
}

// mariaPool opens a pool to database name on the server of base with
// examples/server's settings (orderservice.OpenMySQL's: interpolateParams,
// parseTime, innodb_lock_wait_timeout=5 unless set, 64 connections kept an
// hour) on idempotency.NewMySQLConnector, so that single-phase's record
// travels with the COMMIT; B0 runs on the same pool. Its round trips are
// counted in counts (countedConnector); the family's close closes it.
func (f *family) mariaPool(base *mysql.Config, name string, counts *sqlCounts) (*sql.DB, error) {
	cfg := base.Clone()
	cfg.DBName, cfg.InterpolateParams, cfg.ParseTime, cfg.AllowAllFiles = name, true, true, false
	if _, set := cfg.Params["innodb_lock_wait_timeout"]; !set {
		cfg.Params = maps.Clone(cfg.Params)
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_lock_wait_timeout"] = "5"
	}
	cfg.DialFunc = dialCounted
	var connector driver.Connector
	var err error
	if f.plainMySQL {
		connector, err = mysql.NewConnector(cfg) // what sql.Open gives: no batch
	} else {
		connector, err = idempotency.NewMySQLConnector(cfg)
	}
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(countedConnector{Connector: connector, n: counts})
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	db.SetConnMaxLifetime(time.Hour)
	f.cleanup = append(f.cleanup, func() { db.Close() })
	return db, nil
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

// newService is the example order service over the family's database with
// opts, its Store (when protected) and Dialect filled in.
func (f *family) newService(opts orderservice.Options) (*orderservice.Service, error) {
	if opts.Idempotency {
		opts.Store = f.store
	}
	opts.Dialect = f.dialect
	return orderservice.New(f.db, opts)
}

// httpFrontEnd is a frontEnd over net/http: the service with opts, served
// until the family closes.
func (f *family) httpFrontEnd(opts orderservice.Options, gen generator, replays bool) (target, error) {
	svc, err := f.newService(opts)
	if err != nil {
		return target{}, err
	}
	url, err := f.serveHTTP(svc)
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

// createDatabase creates database name on admin's server with the statement
// create, and drops it with drop when the family closes.
func (f *family) createDatabase(ctx context.Context, admin *sql.DB, name, create, drop string) error {
	if _, err := admin.ExecContext(ctx, create); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	f.cleanup = append(f.cleanup, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, drop); err != nil {
			fmt.Fprintf(os.Stderr, "idembench: drop database %s: %v\n", name, err)
		}
	})
	return nil
}

// databaseName is a fresh database name: idembench_<random>_<label>.
func databaseName(label string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "idembench_" + hex.EncodeToString(b[:]) + "_" + label
}
