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
	"os"
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
