// Package dburl opens the examples' databases from the -db flag's URL
// forms, so that every example program (the HTTP server, the gRPC server,
// the queue consumer) takes the same ones:
//
//	sqlite://PATH                         embedded SQLite (one process)
//	mysql://DSN                           a go-sql-driver DSN (MySQL, MariaDB)
//	postgres://… or postgresql://…        a pgx connection string URL
package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency/examples/internal/cli"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/sqlite"
)

// Usage describes the forms, for a flag's help.
const Usage = "database `URL`: sqlite://PATH, mysql://DSN (a go-sql-driver DSN) or postgres://… (a pgx connection string URL)"

// Open opens url and returns the database, its idempotency store and the
// dialect's name as orderservice.Setup and orderservice.Options know it.
// MySQL is opened as orderservice.OpenMySQL recommends, PostgreSQL by
// postgres.Open; Setup migrates either. Every error names the -db flag and
// the URL without its password, and says so when nothing answered there.
func Open(ctx context.Context, url string) (*sql.DB, idempotency.Store, string, error) {
	db, store, dialect, err := open(ctx, url)
	if err != nil {
		return nil, nil, "", FlagError(url, err)
	}
	return db, store, dialect, nil
}

func open(ctx context.Context, url string) (*sql.DB, idempotency.Store, string, error) {
	switch {
	case strings.HasPrefix(url, "sqlite://"):
		db, err := sqlite.Open(strings.TrimPrefix(url, "sqlite://"))
		if err != nil {
			return nil, nil, "", err
		}
		return db, sqlite.NewStore(db), "sqlite", nil
	case strings.HasPrefix(url, "mysql://"):
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(url, "mysql://"))
		if err != nil {
			return nil, nil, "", err
		}
		db, err := orderservice.OpenMySQL(ctx, cfg)
		if err != nil {
			return nil, nil, "", err
		}
		return db, idempotency.NewMySQLStore(db), "mysql", nil
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		db, err := postgres.Open(url)
		if err != nil {
			return nil, nil, "", err
		}
		return db, postgres.NewStore(db), "postgres", nil
	default:
		return nil, nil, "", errors.New("want sqlite://PATH, mysql://DSN or postgres://USER@HOST:PORT/DB")
	}
}

// FlagError is err from the database named by -db url: it names the flag and
// the URL (its password replaced by ***), and when nothing answered at the
// address it says what to do.
func FlagError(url string, err error) error {
	err = fmt.Errorf("-db %s: %w", Redact(url), err)
	if cli.Unreachable(err) {
		return fmt.Errorf("%w\n  nothing answers at that address: start the database there, or change -db (without -db the example keeps its orders in the embedded SQLite file orders.db)", err)
	}
	return err
}

// Redact returns url with the password it carries, if any, replaced by ***:
// user:secret@ becomes user:***@ (both URL and go-sql-driver DSN forms).
func Redact(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return url
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return url
	}
	return scheme + "://" + user + ":***" + rest[at:]
}
