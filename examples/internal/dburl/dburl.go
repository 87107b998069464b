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
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/sqlite"
)

// Usage describes the forms, for a flag's help.
const Usage = "database: sqlite://PATH, mysql://DSN (a go-sql-driver DSN) or postgres://… (a pgx connection string URL)"

// Open opens url and returns the database, its idempotency store and the
// dialect's name as orderservice.Setup and orderservice.Options know it.
// MySQL is opened as orderservice.OpenMySQL recommends, PostgreSQL by
// postgres.Open; Setup migrates either.
func Open(ctx context.Context, url string) (*sql.DB, idempotency.Store, string, error) {
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
			return nil, nil, "", fmt.Errorf("-db: %w", err)
		}
		db, err := orderservice.OpenMySQL(ctx, cfg)
		if err != nil {
			return nil, nil, "", fmt.Errorf("-db: %w", err)
		}
		return db, idempotency.NewMySQLStore(db), "mysql", nil
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		db, err := postgres.Open(url)
		if err != nil {
			return nil, nil, "", fmt.Errorf("-db: %w", err)
		}
		return db, postgres.NewStore(db), "postgres", nil
	default:
		return nil, nil, "", fmt.Errorf("-db %q: want sqlite://PATH, mysql://DSN or postgres://USER@HOST:PORT/DB", url)
	}
}
