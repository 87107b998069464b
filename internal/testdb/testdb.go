// Package testdb gives each test its own fresh MySQL/MariaDB database.
//
// The server comes from IDEMPOTENCY_TEST_MYSQL_DSN (a go-sql-driver DSN,
// default root@tcp(127.0.0.1:3306)/test). When it is unreachable the test is
// skipped with a message, unless CI=true or IDEMPOTENCY_REQUIRE_MYSQL=1, in
// which case it fails: CI must never pass by skipping.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultDSN is used when IDEMPOTENCY_TEST_MYSQL_DSN is unset.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// Required reports whether MySQL tests must run (fail instead of skip).
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("IDEMPOTENCY_REQUIRE_MYSQL") == "1"
}

// BaseConfig returns the configured server DSN, parsed.
func BaseConfig(t testing.TB) *mysql.Config {
	t.Helper()
	driverLog.install() // before any Config is made: each keeps the logger it was made with
	dsn := os.Getenv("IDEMPOTENCY_TEST_MYSQL_DSN")
	if dsn == "" {
		dsn = DefaultDSN
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("testdb: IDEMPOTENCY_TEST_MYSQL_DSN %q: %v", dsn, err)
	}
	return cfg
}

// MySQL creates a new empty database, returns a handle to it and its DSN,
// and drops it when the test ends.
func MySQL(t testing.TB) (*sql.DB, string) {
	t.Helper()
	CaptureDriverLog(t)
	base := BaseConfig(t)
	admin, err := sql.Open("mysql", base.FormatDSN())
	if err != nil {
		t.Fatalf("testdb: open: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		msg := "testdb: no MySQL/MariaDB at " + base.Addr + " (set IDEMPOTENCY_TEST_MYSQL_DSN, or start one): " + err.Error()
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}

	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("testdb: drop database %s: %v", name, err)
		}
	})

	cfg := base.Clone()
	cfg.DBName = name
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	dsn := cfg.FormatDSN()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("testdb: open %s: %v", name, err)
	}
	db.SetMaxOpenConns(80)
	db.SetMaxIdleConns(80)
	t.Cleanup(func() { db.Close() })
	return db, dsn
}

// CaptureDriverLog keeps go-sql-driver/mysql's log lines out of stderr
// while t runs, and writes the lines logged meanwhile into t's log if t
// fails. The driver logs every connection a server or a fault proxy cuts
// ("packets.go: unexpected EOF", "busy buffer"): hundreds of lines per fault
// spec, which on stderr would bury a failure's message in the CI log. The
// driver has one logger per process, so a failing test shows every line
// logged while it ran, its parallel neighbours' included. MySQL calls it;
// a test that opens its own connections to a server calls it first.
func CaptureDriverLog(t testing.TB) {
	driverLog.install()
	from := driverLog.mark()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		lines, dropped := driverLog.since(from)
		if len(lines) == 0 {
			return
		}
		t.Logf("testdb: %d lines go-sql-driver/mysql logged while this test ran (%d older ones dropped):", len(lines)+dropped, dropped)
		for _, l := range lines {
			t.Log("  mysql: " + l)
		}
	})
}

// driverLogKeep bounds the lines kept: the last ones before a failure are
// the ones that tell.
const driverLogKeep = 500

var driverLog capturedLog

// capturedLog is a mysql.Logger keeping the last driverLogKeep lines, each
// numbered, so a test can ask for the lines logged since it began.
type capturedLog struct {
	once  sync.Once
	mu    sync.Mutex
	next  int      // the number of the next line
	lines []string // lines next-len(lines) .. next-1
}

func (l *capturedLog) install() { l.once.Do(func() { _ = mysql.SetLogger(l) }) }

func (l *capturedLog) Print(v ...any) {
	line := fmt.Sprint(v...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == driverLogKeep {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, time.Now().Format("15:04:05.000 ")+line)
	l.next++
}

func (l *capturedLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// since returns the lines numbered from on that are still kept, and how many
// of them were dropped.
func (l *capturedLog) since(from int) (lines []string, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.next - len(l.lines)
	if from < first {
		dropped, from = first-from, first
	}
	return append([]string(nil), l.lines[from-first:]...), dropped
}
