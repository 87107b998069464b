package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
)

// Round trips to MariaDB per request, counted below database/sql (a
// statement with interpolateParams=true, BEGIN, COMMIT and ROLLBACK are one
// each; a multi-statement batch is one). The bare create is BEGIN, the
// handler's INSERT, COMMIT: 3. A path that gains a round trip fails here.
// PostgreSQL's counts are specified in package postgres
// (roundtrips_test.go), Redis's calls in package idemredis.
//
//	path                                   single-phase   claim-first
//	new key, pool from OpenMySQL           3 (was 4)      5
//	new key, pool from sql.Open            4              5
//	new key, route reading first (hint)    +1 SELECT      —
//	replay, replay cache on                0              0
//	replay, cache off, route reading       1 SELECT       2 (INSERT, SELECT)
//	replay, cache off, route not reading   5              2
//
// "Reading" is single-phase's replayHint: a new process, or a route whose
// retries miss the cache, reads the record before executing. With Redis the
// SQL counts are these (a replay Redis answers costs none). Claim-first is
// the claim's INSERT, BEGIN, the handler's statements, the fenced finish
// and COMMIT: the finish with its fence in the COMMIT's batch (MariaDB's
// IF ROW_COUNT() = 0 THEN SIGNAL …) measured slower than its round trip.
func TestRoundTrips_MariaDB_PerRequest_ModeAndPath(t *testing.T) {
	t.Parallel()
	type path struct {
		name  string
		reads bool // single-phase: the route reads the record first
		cache bool // the replay cache is on
		retry bool // the request is a retry of a finished key
		want  int
	}
	for _, tc := range []struct {
		name  string
		open  func(*mysql.Config, func(driver.Connector) driver.Connector) (*sql.DB, error)
		mode  Mode
		bare  int
		paths []path
	}{
		{"openMySQL/single-phase", openMySQL, ModeSinglePhase, 3, []path{
			{"new key", false, true, false, 3},
			{"new key, reading first", true, true, false, 4},
			{"replay, cache on", false, true, true, 0},
			{"replay, cache off, reading first", true, false, true, 1},
			{"replay, cache off, not reading", false, false, true, 5},
		}},
		{"openMySQL/claim-first", openMySQL, ModeClaimFirst, 3, []path{
			{"new key", false, true, false, 5},
			{"replay, cache on", false, true, true, 0},
			{"replay, cache off", false, false, true, 2},
		}},
		{"sql.Open/single-phase", openPlainMySQL, ModeSinglePhase, 3, []path{
			{"new key", false, true, false, 4},
			{"replay, cache off, not reading", false, false, true, 5},
		}},
		{"sql.Open/claim-first", openPlainMySQL, ModeClaimFirst, 3, []path{
			{"new key", false, true, false, 5},
			{"replay, cache off", false, false, true, 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, n := countedMySQL(t, tc.open)
			ctx := context.Background()
			store := NewMySQLStore(db)
			run := func(ctx context.Context) Result {
				tx, _ := TxFromContext(ctx)
				_, key, _ := KeyFromContext(ctx)
				if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (idem_key) VALUES (?)", key); err != nil {
					return Result{Status: 500, Body: []byte(err.Error())}
				}
				return Result{Status: 201, Body: []byte(`{"ok":true}`)}
			}
			bare := func(key string) {
				tx, err := store.BeginTx(ctx)
				require.NoError(t, err)
				require.Equal(t, 201, run(context.WithValue(ctx, contextKey{}, &execution{tx: tx, key: key})).Status)
				require.NoError(t, tx.Commit())
			}
			bare("warm-up") // the dialect adapts on the store's first use
			before := n.load()
			bare("bare")
			require.Equal(t, tc.bare, n.load()-before, "the bare create")

			for i, p := range tc.paths {
				t.Run(p.name, func(t *testing.T) {
					cfg := &Config{Mode: tc.mode}
					if !p.cache {
						cfg.ReplayCacheBytes = -1
					}
					mw, err := New(store, cfg)
					require.NoError(t, err)
					mw.replayHint.skip.Store(!p.reads)
					do := func(key string) Answer {
						return mw.Do(ctx, Action{Scope: "s", Key: key, Fingerprint: "fp"}, run)
					}
					key := fmt.Sprint("path-", i)
					if p.retry {
						require.Equal(t, 201, do(key).Status)
					}
					before := n.load()
					a := do(key)
					got := n.load() - before
					require.Equal(t, 201, a.Status, "%+v", a.Problem)
					require.Equal(t, p.retry, a.Replayed)
					require.Equal(t, p.want, got, "round trips")
				})
			}
		})
	}
}

// openMySQL opens OpenMySQL's pool with the connections of inner.
func openMySQL(cfg *mysql.Config, wrap func(driver.Connector) driver.Connector) (*sql.DB, error) {
	c, err := NewMySQLConnector(cfg)
	if err != nil {
		return nil, err
	}
	inner := c.(withCommitConnector)
	return sql.OpenDB(withCommitConnector{Connector: wrap(inner.Connector)}), nil
}

// openPlainMySQL opens go-sql-driver's own pool, as sql.Open does.
func openPlainMySQL(cfg *mysql.Config, wrap func(driver.Connector) driver.Connector) (*sql.DB, error) {
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(wrap(c)), nil
}

// countedMySQL opens a fresh database with open, its connections counted
// below database/sql (and below OpenMySQL's batching), migrated, with a
// ledger table for the handler.
func countedMySQL(t *testing.T, open func(*mysql.Config, func(driver.Connector) driver.Connector) (*sql.DB, error)) (*sql.DB, *roundTrips) {
	t.Helper()
	plain, dsn := testdb.MySQL(t)
	require.NoError(t, Migrate(context.Background(), plain))
	_, err := plain.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL)")
	require.NoError(t, err)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	n := &roundTrips{}
	db, err := open(cfg, func(c driver.Connector) driver.Connector { return countingConnector{Connector: c, n: n} })
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, n
}

// roundTrips counts what a pool's connections send: statements (each one
// round trip with interpolateParams=true, a batch included), BEGIN, COMMIT
// and ROLLBACK.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) load() int { return int(r.n.Load()) }

type countingConnector struct {
	driver.Connector
	n *roundTrips
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, n: c.n}, nil
}

// countingConn passes every optional interface of go-sql-driver's
// connection through.
type countingConn struct {
	driver.Conn
	n *roundTrips
}

func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.n.Add(1)
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{Tx: tx, n: c.n}, nil
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	if err != driver.ErrSkip {
		c.n.n.Add(1)
	}
	return res, err
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != driver.ErrSkip {
		c.n.n.Add(1)
	}
	return rows, err
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *countingConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type countingTx struct {
	driver.Tx
	n *roundTrips
}

func (t countingTx) Commit() error {
	t.n.n.Add(1)
	return t.Tx.Commit()
}

func (t countingTx) Rollback() error {
	t.n.n.Add(1)
	return t.Tx.Rollback()
}
