package main

import (
	"context"
	"database/sql/driver"
	"sync/atomic"
)

// sqlCounts counts what this process sends to the database: statements
// (each one round trip with interpolateParams=true), and transaction
// BEGIN/COMMIT/ROLLBACK, which are round trips too. Unlike the server's
// global counters it sees only this benchmark's traffic.
type sqlCounts struct {
	stmts, begins, commits, rollbacks atomic.Int64
}

func (c *sqlCounts) snapshot() map[string]float64 {
	begins, commits, rollbacks := c.begins.Load(), c.commits.Load(), c.rollbacks.Load()
	return map[string]float64{
		"round_trips": float64(c.stmts.Load() + begins + commits + rollbacks),
		"commits":     float64(commits),
	}
}

// countingConnector wraps a driver.Connector and counts through its
// connections.
type countingConnector struct {
	driver.Connector
	n *sqlCounts
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn: conn, n: c.n}, nil
}

// countingConn passes every optional interface of go-sql-driver/mysql's
// connection through.
type countingConn struct {
	conn driver.Conn
	n    *sqlCounts
}

func (c *countingConn) Prepare(query string) (driver.Stmt, error) { return c.conn.Prepare(query) }
func (c *countingConn) Close() error                              { return c.conn.Close() }
func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.begins.Add(1)
	var tx driver.Tx
	var err error
	if b, ok := c.conn.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = c.conn.Begin() //nolint:staticcheck // the fallback database/sql uses too
	}
	if err != nil {
		return nil, err
	}
	return countingTx{tx: tx, n: c.n}, nil
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.conn.Prepare(query)
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.n.stmts.Add(1)
	res, err := e.ExecContext(ctx, query, args)
	if err == driver.ErrSkip {
		c.n.stmts.Add(-1)
	}
	return res, err
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.n.stmts.Add(1)
	rows, err := q.QueryContext(ctx, query, args)
	if err == driver.ErrSkip {
		c.n.stmts.Add(-1)
	}
	return rows, err
}

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) IsValid() bool {
	if v, ok := c.conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

type countingTx struct {
	tx driver.Tx
	n  *sqlCounts
}

func (t countingTx) Commit() error {
	t.n.commits.Add(1)
	return t.tx.Commit()
}

func (t countingTx) Rollback() error {
	t.n.rollbacks.Add(1)
	return t.tx.Rollback()
}
