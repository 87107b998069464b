package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/sqlite"
)

const (
	envDatabase  = "IDEMCTL_DB"
	schemeMySQL  = "mysql://"
	schemeSQLite = "sqlite://"
	// PostgreSQL's URLs are pgx connection strings, scheme and all.
	schemePostgres   = "postgres://"
	schemePostgreSQL = "postgresql://"

	// connectTimeout bounds the first connection (dial plus ping).
	connectTimeout = 5 * time.Second

	formatMySQL    = "mysql://USER[:PASSWORD]@tcp(HOST:PORT)/DBNAME, e.g. mysql://root@tcp(127.0.0.1:3306)/orders"
	formatSQLite   = "sqlite://PATH, e.g. sqlite:///var/lib/orders.db"
	formatPostgres = "postgres://USER[:PASSWORD]@HOST:PORT/DBNAME[?PARAM=VALUE...], e.g. postgres://app@127.0.0.1:5432/orders?sslmode=disable"
)

// PostgreSQL SQLSTATEs the operator gets a sentence for.
const (
	sqlStateInvalidPassword      = "28P01"
	sqlStateInvalidAuthorization = "28000"
	sqlStateInvalidCatalogName   = "3D000" // no such database
	sqlStateUndefinedTable       = "42P01"
)

// database is an open, reachable store.
type database struct {
	db      *sql.DB
	store   *idempotency.SQLStore
	dialect string // "mysql", "sqlite" or "postgres", as the migrations name them
	where   string // for messages; never the password
}

func (d *database) Close() error { return d.db.Close() }

// open connects to the database named by dbURL (or $IDEMCTL_DB). Every error
// is an exitError: usage when no URL is given, connect otherwise. create
// allows an SQLite file that does not exist yet (for migrate); the other
// commands refuse it rather than inspect a fresh, empty file.
func (c *cli) open(ctx context.Context, dbURL string, create bool) (*database, error) {
	if dbURL == "" {
		dbURL = c.getenv(envDatabase)
	}
	switch {
	case dbURL == "":
		return nil, fail(exitUsage, "no database: pass --db URL or set %s (%s, %s, or %s)", envDatabase, formatMySQL, formatPostgres, formatSQLite)
	case strings.HasPrefix(dbURL, schemeMySQL):
		return openMySQL(ctx, strings.TrimPrefix(dbURL, schemeMySQL))
	case strings.HasPrefix(dbURL, schemePostgres), strings.HasPrefix(dbURL, schemePostgreSQL):
		return openPostgres(ctx, dbURL)
	case strings.HasPrefix(dbURL, schemeSQLite):
		return openSQLite(strings.TrimPrefix(dbURL, schemeSQLite), create)
	}
	scheme, _, found := strings.Cut(dbURL, "://")
	if !found {
		return nil, fail(exitConnect, "--db: the URL has no scheme; write %s, %s, or %s", formatMySQL, formatPostgres, formatSQLite)
	}
	return nil, fail(exitConnect, "--db: unknown scheme %q; write %s, %s, or %s", scheme, formatMySQL, formatPostgres, formatSQLite)
}

func openMySQL(ctx context.Context, dsn string) (*database, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		hint := ""
		if !strings.Contains(dsn, "(") {
			hint = "; the address goes inside tcp(...), this is not a URL"
		}
		return nil, fail(exitConnect, "--db: malformed MySQL DSN (%v)%s; write %s", err, hint, formatMySQL)
	}
	if cfg.DBName == "" {
		return nil, fail(exitConnect, "--db: the MySQL DSN names no database; write %s", formatMySQL)
	}
	// As the library recommends: one round trip per statement, and times
	// scanned as time.Time.
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	if cfg.Timeout == 0 {
		cfg.Timeout = connectTimeout
	}
	cfg.Logger = &mysql.NopLogger{} // every error reaches the operator through us
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fail(exitConnect, "--db: %v; write %s", err, formatMySQL)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(4)

	where := fmt.Sprintf("MySQL/MariaDB at %s, database %s", cfg.Addr, cfg.DBName)
	if cfg.Net == "unix" {
		where = fmt.Sprintf("MySQL/MariaDB on unix socket %s, database %s", cfg.Addr, cfg.DBName)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == 1045:
			return nil, fail(exitConnect, "cannot connect to %s as user %q: access denied; check the user and password in --db", where, cfg.User)
		case errors.As(err, &me) && me.Number == 1049:
			return nil, fail(exitConnect, "cannot connect to %s: the database does not exist; create it, then run idemctl migrate", where)
		case errors.Is(err, context.DeadlineExceeded) || pingCtx.Err() != nil:
			return nil, fail(exitConnect, "cannot connect to %s: no answer within %v; check that the server runs and the address in --db (%s)", where, connectTimeout, formatMySQL)
		default:
			return nil, fail(exitConnect, "cannot connect to %s: %v; check that the server runs and the address in --db (%s)", where, err, formatMySQL)
		}
	}
	return &database{db: db, store: idempotency.NewMySQLStore(db), dialect: "mysql", where: where}, nil
}

// openPostgres opens a pgx connection string URL, as postgres.Open does but
// with a small pool and a message per failure an operator can act on. Its
// runtime parameters (search_path for a schema other than public) apply.
func openPostgres(ctx context.Context, dbURL string) (*database, error) {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		// pgx's message quotes the URL with its password masked.
		return nil, fail(exitConnect, "--db: malformed PostgreSQL URL (%v); write %s", err, formatPostgres)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(4)

	where := fmt.Sprintf("PostgreSQL at %s:%d, database %s", cfg.Host, cfg.Port, cfg.Database)
	if schema := cfg.RuntimeParams["search_path"]; schema != "" {
		where += ", schema " + schema
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		state := sqlStateOf(err)
		switch {
		case state == sqlStateInvalidPassword || state == sqlStateInvalidAuthorization:
			return nil, fail(exitConnect, "cannot connect to %s as user %q: access denied; check the user and password in --db", where, cfg.User)
		case state == sqlStateInvalidCatalogName:
			return nil, fail(exitConnect, "cannot connect to %s: the database does not exist; create it, then run idemctl migrate", where)
		case errors.Is(err, context.DeadlineExceeded) || pingCtx.Err() != nil:
			return nil, fail(exitConnect, "cannot connect to %s: no answer within %v; check that the server runs and the address in --db (%s)", where, connectTimeout, formatPostgres)
		default:
			return nil, fail(exitConnect, "cannot connect to %s: %v; check that the server runs and the address in --db (%s)", where, err, formatPostgres)
		}
	}
	return &database{db: db, store: postgres.NewStore(db), dialect: "postgres", where: where}, nil
}

// sqlStateOf returns the SQLSTATE of a PostgreSQL server error, or "".
func sqlStateOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func openSQLite(path string, create bool) (*database, error) {
	if path == "" {
		return nil, fail(exitConnect, "--db: sqlite:// needs a file path; write %s", formatSQLite)
	}
	if !create {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fail(exitConnect, "no SQLite database at %s; check the path (write %s), or create it with idemctl --db sqlite://%s migrate", path, formatSQLite, path)
		}
	}
	db, err := sqlite.Open(path)
	if err != nil {
		return nil, fail(exitConnect, "cannot open the SQLite database: %v; write %s", err, formatSQLite)
	}
	return &database{db: db, store: sqlite.NewStore(db), dialect: "sqlite", where: "SQLite file " + path}, nil
}

// withHint explains the usual cause of a failure: a schema that was never
// migrated.
func withHint(err error) string {
	var me *mysql.MySQLError
	if (errors.As(err, &me) && me.Number == 1146) || sqlStateOf(err) == sqlStateUndefinedTable ||
		strings.Contains(err.Error(), "no such table") {
		return err.Error() + " (is the schema migrated? run idemctl migrate)"
	}
	return err.Error()
}
