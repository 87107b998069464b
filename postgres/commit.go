package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/orderguard/idempotency"
)

// OpenDB is stdlib.OpenDB with one difference: single-phase's record
// INSERT, the business transaction's last statement, travels to the server
// together with the COMMIT, in one pgx pipeline. That saves one of the
// transaction's round trips, the whole cost of the record but for the row
// itself (a bare create is BEGIN, the handler's statements, COMMIT).
// Everything else on the connections is pgx's database/sql driver as is.
// Open uses it; NewStore recognises a *sql.DB from it.
//
// The record's INSERT then has no ON CONFLICT clause: a key that is taken
// fails it with a unique violation, which aborts the transaction, so the
// COMMIT behind it commits nothing. (*sql.Tx).Commit reports that as an
// error matching idempotency.ErrKeyClaimed, and the middleware answers with
// the record that holds the key, as it does when the INSERT reports it.
func OpenDB(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return sql.OpenDB(NewConnector(cfg, opts...))
}

// NewConnector is the connector OpenDB opens its pool on, for a caller that
// wraps it (to trace connection attempts, say) before sql.OpenDB. A wrapper
// must return the wrapped connector's Driver, by which NewStore recognises
// the pool.
//
// Its connection attempts are patient where waiting helps: one the server
// refuses for want of a slot (53300) is made again for up to SlotWait, and
// one the network cuts before the session is ready is made again at once,
// a few times. Every other failure returns at once.
func NewConnector(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) driver.Connector {
	return connector{Connector: stdlib.GetConnector(cfg, opts...)}
}

// sendsFinalWithCommit reports whether db's connections come from OpenDB.
func sendsFinalWithCommit(db *sql.DB) bool {
	_, ok := db.Driver().(pipelinedDriver)
	return ok
}

// pipelinedDriver is the driver of OpenDB's databases; Open, which
// database/sql calls only for sql.Open, wraps pgx's connections the same
// way.
type pipelinedDriver struct{ driver.Driver }

func (d pipelinedDriver) Open(name string) (driver.Conn, error) {
	dc, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: dc.(*stdlib.Conn)}, nil
}

// conn is pgx's connection, holding back the record's INSERT until COMMIT.
// database/sql uses a connection from one goroutine at a time.
type conn struct {
	*stdlib.Conn
	inTx  bool    // a transaction began here and is open
	final *queued // the INSERT held back for the COMMIT

	pool *adaptive // Open's pool, told when the connection dies; else nil
	born time.Time // when the session was ready
}

type queued struct {
	query string
	args  []any
}

func (c *conn) Begin() (driver.Tx, error) { return c.BeginTx(context.Background(), driver.TxOptions{}) }

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	inner, err := c.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.inTx, c.final = true, nil
	return &pipelinedTx{Tx: inner, c: c, ctx: ctx}, nil
}

// ExecContext holds back the record's INSERT inside a transaction and
// reports the one row it will insert; a taken key fails the COMMIT instead.
// Any other statement first sends an INSERT held back, so that statements
// run in the order they were given.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if query == insertFinalWithCommit && c.inTx && c.final == nil {
		c.final = &queued{query: query, args: values(args)}
		return driver.RowsAffected(1), nil
	}
	if err := c.sendFinal(ctx); err != nil {
		return nil, err
	}
	return c.Conn.ExecContext(ctx, query, args)
}

// QueryContext reports a query that never reached the server, outside a
// transaction, as driver.ErrBadConn, so that database/sql runs it on another
// connection, as pgx's ExecContext does for a statement: pgx's QueryContext
// meets a write that failed before its first byte only when it reads the
// first row, and returns it as is.
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.sendFinal(ctx); err != nil {
		return nil, err
	}
	rows, err := c.Conn.QueryContext(ctx, query, args)
	if err != nil && !c.inTx && pgconn.SafeToRetry(err) {
		return nil, driver.ErrBadConn
	}
	return rows, err
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.sendFinal(ctx); err != nil {
		return nil, err
	}
	return c.Conn.PrepareContext(ctx, query)
}

// sendFinal runs a held-back INSERT on its own.
func (c *conn) sendFinal(ctx context.Context) error {
	q := c.final
	if q == nil {
		return nil
	}
	c.final = nil
	_, err := c.Conn.Conn().Exec(ctx, q.query, q.args...)
	return err
}

func values(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

type pipelinedTx struct {
	driver.Tx
	c   *conn
	ctx context.Context // BeginTx's, as pgx's own transaction keeps it
}

func (t *pipelinedTx) Rollback() error {
	t.c.inTx, t.c.final = false, nil
	return t.Tx.Rollback()
}

// Commit sends a held-back INSERT and the COMMIT in one pipeline. The
// server stops at the first error in it: a failed INSERT leaves the
// transaction aborted and the COMMIT unrun, and it is rolled back.
func (t *pipelinedTx) Commit() error {
	q := t.c.final
	t.c.inTx, t.c.final = false, nil
	if q == nil {
		return t.Tx.Commit()
	}
	batch := &pgx.Batch{}
	batch.Queue(q.query, q.args...)
	batch.Queue("commit")
	results := t.c.Conn.Conn().SendBatch(t.ctx, batch)
	_, insertErr := results.Exec()
	tag, commitErr := results.Exec()
	closeErr := results.Close()
	switch {
	case insertErr != nil:
		if t.c.Conn.Conn().PgConn().TxStatus() == 'E' {
			// The server refused the INSERT: nothing committed.
			_ = t.Tx.Rollback()
			if sqlStateIs(insertErr, sqlStateUniqueViolation) {
				return fmt.Errorf("%w: %w", idempotency.ErrKeyClaimed, insertErr)
			}
		}
		return insertErr
	case commitErr != nil:
		return commitErr
	case closeErr != nil:
		return closeErr
	case tag.String() != "COMMIT":
		// The server answered ROLLBACK: the transaction had failed before.
		return errRolledBack
	}
	return nil
}

var errRolledBack = errors.New("postgres: commit unexpectedly resulted in rollback")
