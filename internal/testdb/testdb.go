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
	installDriverLog() // before any Config is made: each keeps the logger it was made with
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
// (see LineLog): MySQL calls it; a test that opens its own connections to
// a server calls it first.
func CaptureDriverLog(t testing.TB) {
	installDriverLog()
	driverLog.Watch(t)
}

func installDriverLog() { driverLogOnce.Do(func() { _ = mysql.SetLogger(driverLog) }) }

var (
	driverLog     = NewLineLog("go-sql-driver/mysql")
	driverLogOnce sync.Once
)

// lineLogKeep bounds the lines a LineLog keeps: the last ones before a
// failure are the ones that tell.
const lineLogKeep = 500

// LineLog is a library's process-wide logger for tests (go-sql-driver's,
// go-redis's): it keeps the lines out of stderr, where a fault spec's
// hundreds of them ("packets.go: unexpected EOF", "busy buffer", "failed
// to dial") would bury a failure's message in the CI log, and hands a
// failing test the lines logged while it ran (its parallel neighbours'
// included: the logger is one per process). It keeps the last
// lineLogKeep lines, each numbered.
type LineLog struct {
	name  string
	mu    sync.Mutex
	next  int      // the number of the next line
	lines []string // lines next-len(lines) .. next-1
}

// NewLineLog returns a LineLog for the library called name; install it as
// that library's logger once (an adapter to its interface where needed).
func NewLineLog(name string) *LineLog { return &LineLog{name: name} }

// Print keeps a line, as fmt.Sprint formats it (mysql.Logger).
func (l *LineLog) Print(v ...any) { l.keep(fmt.Sprint(v...)) }

// Printf keeps a line, as fmt.Sprintf formats it.
func (l *LineLog) Printf(format string, v ...any) { l.keep(fmt.Sprintf(format, v...)) }

func (l *LineLog) keep(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == lineLogKeep {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, time.Now().Format("15:04:05.000 ")+line)
	l.next++
}

// Watch logs, if t fails, the lines kept from now until t ends.
func (l *LineLog) Watch(t testing.TB) {
	from := l.mark()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		lines, dropped := l.since(from)
		if len(lines) == 0 {
			return
		}
		t.Logf("testdb: %d lines %s logged while this test ran (%d older ones dropped):", len(lines)+dropped, l.name, dropped)
		for _, line := range lines {
			t.Log("  " + line)
		}
	})
}

func (l *LineLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// since returns the lines numbered from on that are still kept, and how many
// of them were dropped.
func (l *LineLog) since(from int) (lines []string, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.next - len(l.lines)
	if from < first {
		dropped, from = first-from, first
	}
	return append([]string(nil), l.lines[from-first:]...), dropped
}
