package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// OpenMySQL opens a pool for NewMySQLStore on which single-phase's record
// INSERT, the business transaction's last statement, travels to the server
// with the COMMIT, in one multi-statement batch. That saves one of the
// transaction's round trips, so a single-phase new key costs the round
// trips of the bare create. Everything else on the connections is
// go-sql-driver/mysql as cfg configures it (give it interpolateParams=true:
// a batch with arguments needs it, and without it the record travels on
// its own as with sql.Open).
//
// The batch needs the connection's multiStatements capability, which the
// pool turns on (cfg is not changed). Multi-statements widen what an SQL
// injection can do, so the pool's connections refuse, before it reaches
// the server, any other statement that holds more than one (a ';' outside
// quotes and comments followed by more SQL): the handlers' statements keep
// the single-statement guarantee of a connection without the capability.
// (A compound statement, such as MariaDB's BEGIN NOT ATOMIC … END, is
// refused too; prepared statements are one statement by the protocol.)
//
// Batched, the record's INSERT reports at COMMIT what it would have
// reported on its own: a taken key fails (*sql.Tx).Commit with an error
// matching ErrKeyClaimed, and nothing is committed (the server stops a
// batch at its first error, and the transaction is rolled back).
//
// Claim-first's finish is not batched: its fence (an UPDATE that matched
// no row) must stop the COMMIT, which in a batch takes a statement that
// fails on purpose; on MariaDB the one that does (IF ROW_COUNT() = 0 THEN
// SIGNAL …) cost more than the round trip it saves: measured side by
// side, claim-first ran 2 to 10 % slower with it, the database spending
// about 56 µs more CPU a request.
func OpenMySQL(cfg *mysql.Config) (*sql.DB, error) {
	c, err := NewMySQLConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// NewMySQLConnector is the connector OpenMySQL opens its pool on, for a
// caller that wraps it before sql.OpenDB. A wrapper must return the wrapped
// connector's Driver, by which NewMySQLStore recognises the pool.
func NewMySQLConnector(cfg *mysql.Config) (driver.Connector, error) {
	cfg = cfg.Clone()
	cfg.MultiStatements = true
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return withCommitConnector{Connector: c}, nil
}

// withCommitConnector makes the connections of OpenMySQL's pool.
type withCommitConnector struct{ driver.Connector }

func (c withCommitConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	galera, err := wsrepOn(ctx, dc)
	if err != nil {
		_ = dc.Close()
		return nil, err
	}
	return &withCommitConn{Conn: dc, unbatched: galera}, nil
}

// wsrepOn reports whether the server replicates with Galera (wsrep_on),
// read once per connection. On Galera a conflict between nodes shows at
// COMMIT (certification), and the batch of the record's INSERT and the
// COMMIT was seen acknowledged for transactions no node held
// (clustertest, single-phase: a key answered 201 twice with two orders,
// and a 201 whose order a node kill then showed missing), so there the
// INSERT and the COMMIT go one after the other, as on sql.Open. MySQL,
// which has no such variable, batches.
func wsrepOn(ctx context.Context, dc driver.Conn) (bool, error) {
	q, ok := dc.(driver.QueryerContext)
	if !ok {
		return false, nil
	}
	rows, err := q.QueryContext(ctx, "SELECT @@wsrep_on", nil)
	if mysqlErrorIs(err, mysqlErrUnknownSystemVariable) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return false, err
	}
	switch x := v[0].(type) {
	case int64:
		return x == 1, nil
	case []byte:
		return string(x) == "1" || strings.EqualFold(string(x), "ON"), nil
	}
	return false, nil
}

func (c withCommitConnector) Driver() driver.Driver { return withCommitDriver{c.Connector.Driver()} }

// withCommitDriver is the driver of OpenMySQL's pools.
type withCommitDriver struct{ driver.Driver }

// sendsWithCommit reports whether db's connections come from OpenMySQL.
func sendsWithCommit(db *sql.DB) bool {
	if db == nil {
		return false
	}
	_, ok := db.Driver().(withCommitDriver)
	return ok
}

// heldKey marks, in a statement's context, the store's record INSERT that
// may wait for the COMMIT.
type heldKey struct{}

// withCommit marks ctx for a record INSERT to be sent with the COMMIT.
func withCommit(ctx context.Context) context.Context {
	return context.WithValue(ctx, heldKey{}, true)
}

// heldStatement is a record INSERT waiting for the COMMIT.
type heldStatement struct {
	ctx   context.Context
	query string
	args  []driver.NamedValue
}

// withCommitConn is go-sql-driver's connection, holding back the record's
// INSERT until COMMIT. database/sql uses a connection from one
// goroutine at a time.
type withCommitConn struct {
	driver.Conn
	inTx bool
	held *heldStatement
	// unbatched: a Galera node (wsrepOn); nothing is held back.
	unbatched bool
}

var (
	_ driver.ExecerContext      = (*withCommitConn)(nil)
	_ driver.QueryerContext     = (*withCommitConn)(nil)
	_ driver.ConnBeginTx        = (*withCommitConn)(nil)
	_ driver.ConnPrepareContext = (*withCommitConn)(nil)
	_ driver.SessionResetter    = (*withCommitConn)(nil)
	_ driver.Validator          = (*withCommitConn)(nil)
	_ driver.NamedValueChecker  = (*withCommitConn)(nil)
	_ driver.Pinger             = (*withCommitConn)(nil)
)

func (c *withCommitConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *withCommitConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	inner, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.inTx, c.held = true, nil
	return &withCommitTx{Tx: inner, c: c}, nil
}

// ExecContext holds back the store's record INSERT inside a transaction
// and reports the one row it will insert; a taken key fails the COMMIT
// instead. Any other statement first sends an INSERT held back, so that
// statements run in the order they were given, and is refused if it holds
// several statements.
func (c *withCommitConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if ctx.Value(heldKey{}) != nil && c.inTx && c.held == nil && !c.unbatched {
		c.held = &heldStatement{ctx: ctx, query: query, args: args}
		return driver.RowsAffected(1), nil
	}
	if err := refuseMultiStatements(query); err != nil {
		return nil, err
	}
	if err := c.sendHeld(); err != nil {
		return nil, err
	}
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *withCommitConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := refuseMultiStatements(query); err != nil {
		return nil, err
	}
	if err := c.sendHeld(); err != nil {
		return nil, err
	}
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

// PrepareContext needs no check: the server prepares one statement only.
func (c *withCommitConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.sendHeld(); err != nil {
		return nil, err
	}
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *withCommitConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// sendHeld runs a held-back INSERT on its own.
func (c *withCommitConn) sendHeld() error {
	h := c.held
	if h == nil {
		return nil
	}
	c.held = nil
	_, err := c.Conn.(driver.ExecerContext).ExecContext(h.ctx, h.query, h.args)
	return heldError(err)
}

func (c *withCommitConn) ResetSession(ctx context.Context) error {
	c.inTx, c.held = false, nil
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *withCommitConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *withCommitConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *withCommitConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type withCommitTx struct {
	driver.Tx
	c *withCommitConn
}

func (t *withCommitTx) Rollback() error {
	t.c.inTx, t.c.held = false, nil
	return t.Tx.Rollback()
}

// Commit sends a held-back INSERT and the COMMIT in one batch. The server
// stops at the first error: the COMMIT did not run, and the transaction
// (still open after a duplicate key) is rolled back.
func (t *withCommitTx) Commit() error {
	h := t.c.held
	t.c.inTx, t.c.held = false, nil
	if h == nil {
		return t.Tx.Commit()
	}
	_, err := t.c.Conn.(driver.ExecerContext).ExecContext(h.ctx, h.query+";\nCOMMIT", h.args)
	switch {
	case errors.Is(err, driver.ErrSkip):
		// Arguments not interpolated (interpolateParams=false): the INSERT
		// goes on its own, prepared, then the COMMIT.
		if _, err := t.sendPrepared(h); err != nil {
			_ = t.Tx.Rollback()
			return heldError(err)
		}
		return t.Tx.Commit()
	case err == nil:
		return nil // committed; the driver's Tx has nothing left to do
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		// The server refused a statement of the batch: nothing committed.
		_ = t.Tx.Rollback()
	}
	return heldError(err)
}

// sendPrepared runs h as a prepared statement.
func (t *withCommitTx) sendPrepared(h *heldStatement) (driver.Result, error) {
	stmt, err := t.c.Conn.(driver.ConnPrepareContext).PrepareContext(h.ctx, h.query)
	if err != nil {
		return nil, err
	}
	defer stmt.Close()
	return stmt.(driver.StmtExecContext).ExecContext(h.ctx, h.args)
}

// heldError translates a held INSERT's refusal: a duplicate key means the
// key is taken.
func heldError(err error) error {
	if mysqlErrorIs(err, mysqlErrDupEntry) {
		return fmt.Errorf("%w: %w", ErrKeyClaimed, err)
	}
	return err
}

// refuseMultiStatements refuses a query holding more than one statement: a
// ';' outside quotes and comments with more SQL after it. It errs on the
// side of refusing: a quote is read both with and without backslash escapes
// (the server's sql_mode decides), and MariaDB's executable comments
// (/*! … */, /*M! … */) are read as SQL.
func refuseMultiStatements(query string) error {
	// Without a ';' there is one statement: most queries are done by one
	// vectorized scan instead of two walks of the text.
	if strings.IndexByte(query, ';') < 0 {
		return nil
	}
	if severalStatements(query, true) || severalStatements(query, false) {
		return errors.New("idempotency: a statement holding several statements is refused on a pool from OpenMySQL (multi-statements are on for the record's batch only)")
	}
	return nil
}

// severalStatements reports a ';' outside quotes and comments that more
// SQL follows, reading a backslash in quotes as an escape or not.
func severalStatements(q string, backslash bool) bool {
	ended := false // a ';' was seen outside quotes and comments
	for i := 0; i < len(q); i++ {
		ch := q[i]
		switch {
		case ch == '\'' || ch == '"' || ch == '`':
			if ended {
				return true
			}
			i = quoteEnd(q, i, backslash && ch != '`')
		case ch == '#' || (ch == '-' && i+2 < len(q) && q[i+1] == '-' && (q[i+2] == ' ' || q[i+2] == '\t' || q[i+2] == '\n' || q[i+2] == '\r')):
			for i < len(q) && q[i] != '\n' {
				i++
			}
		case ch == '/' && i+1 < len(q) && q[i+1] == '*' && !(i+2 < len(q) && (q[i+2] == '!' || q[i+2] == 'M')):
			end := indexFrom(q, i+2, "*/")
			if end < 0 {
				return ended
			}
			i = end + 1
		case ch == ';':
			ended = true
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
		default:
			if ended {
				return true
			}
		}
	}
	return false
}

// quoteEnd returns the index of the quote that closes the one at start (a
// doubled quote is part of the text), or the end of q.
func quoteEnd(q string, start int, backslash bool) int {
	quote := q[start]
	for i := start + 1; i < len(q); i++ {
		switch {
		case backslash && q[i] == '\\':
			i++
		case q[i] == quote && i+1 < len(q) && q[i+1] == quote:
			i++
		case q[i] == quote:
			return i
		}
	}
	return len(q)
}

func indexFrom(s string, from int, sub string) int {
	for i := from; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
