package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// The specifications of OpenMySQL: the record's last statement travels to
// the server with the COMMIT, and everything it would do on its own still
// holds (the round trips are counted in roundtrips_internal_test.go).

// ledgerDB is a fresh database on OpenMySQL's pool, dialled through dial
// when it is set, with a ledger table for the actions below.
func ledgerDB(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (db, direct *sql.DB) {
	t.Helper()
	return ledgerDBWith(t, func(cfg *mysql.Config) { cfg.DialFunc = dial })
}

// ledgerDBWith is ledgerDB with OpenMySQL's configuration changed by edit.
func ledgerDBWith(t *testing.T, edit func(*mysql.Config)) (db, direct *sql.DB) {
	t.Helper()
	direct, dsn := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), direct))
	_, err := direct.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL)")
	require.NoError(t, err)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	edit(cfg)
	db, err = idempotency.OpenMySQL(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, direct
}

// appendLedgerRun is an action with one statement of its own; during runs
// it calls it first.
func appendLedgerRun(during func(ctx context.Context)) idempotency.RunFunc {
	return func(ctx context.Context) idempotency.Result {
		tx, _ := idempotency.TxFromContext(ctx)
		_, key, _ := idempotency.KeyFromContext(ctx)
		if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (idem_key) VALUES (?)", key); err != nil {
			return idempotency.Result{Status: http.StatusInternalServerError, Body: []byte(err.Error())}
		}
		if during != nil {
			during(ctx)
		}
		return idempotency.Result{Status: http.StatusCreated, Body: []byte(`{"ok":true}`)}
	}
}

func ledgerRows(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM ledger WHERE idem_key = ?", key).Scan(&n))
	return n
}

func finalClaim(key string) idempotency.Claim {
	return idempotency.Claim{Scope: "s", Key: key, Fingerprint: "fp", Owner: "o-" + key, Retention: time.Hour}
}

var doneSnapshot = &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{}, Body: []byte(`{}`)}

// With interpolateParams=false the record's statement cannot join a batch
// (its arguments would need a prepared statement): it goes on its own at
// COMMIT, with the same answers.
func TestOpenMySQL_ATakenKey_FailsTheCommitAsErrKeyClaimed_AndCommitsNothing(t *testing.T) {
	t.Parallel()
	for _, interpolate := range []bool{true, false} {
		t.Run(fmt.Sprint("interpolateParams=", interpolate), func(t *testing.T) {
			t.Parallel()
			db, direct := ledgerDBWith(t, func(cfg *mysql.Config) { cfg.InterpolateParams = interpolate })
			takenKeyCommitsNothing(t, db, direct)
		})
	}
}

func takenKeyCommitsNothing(t *testing.T, db, direct *sql.DB) {
	db.SetMaxOpenConns(1) // the refused batch's connection serves the next transaction
	store := idempotency.NewMySQLStore(db)
	ctx := context.Background()
	require.NoError(t, store.InsertFinal(ctx, nil, finalClaim("taken"), idempotency.StatusDone, doneSnapshot))

	tx, err := store.BeginTx(ctx)
	require.NoError(t, err)
	_, err = tx.Exec("INSERT INTO ledger (idem_key) VALUES ('taken')")
	require.NoError(t, err)
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("taken"), idempotency.StatusDone, doneSnapshot),
		"the INSERT waits for the COMMIT")
	require.ErrorIs(t, tx.Commit(), idempotency.ErrKeyClaimed)
	require.Zero(t, ledgerRows(t, direct, "taken"), "the business row rolled back with the record")

	tx, err = store.BeginTx(ctx)
	require.NoError(t, err)
	_, err = tx.Exec("INSERT INTO ledger (idem_key) VALUES ('free')")
	require.NoError(t, err)
	require.NoError(t, store.InsertFinal(ctx, tx, finalClaim("free"), idempotency.StatusDone, doneSnapshot))
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, ledgerRows(t, direct, "free"))
	require.Zero(t, ledgerRows(t, direct, "taken"), "nothing of the refused transaction was left open to commit later")
}

// Claim-first on OpenMySQL's pool: the finish is not held for the COMMIT
// but sent on its own, fenced (see OpenMySQL). A lease taken over while the
// action ran stops the transaction before its COMMIT: the action's row does
// not commit, and the answer is the key's current state, never a 201.
func TestOpenMySQL_ClaimFirst_ALeaseLostWhileRunning_CommitsNothing(t *testing.T) {
	t.Parallel()
	for _, interpolate := range []bool{true, false} {
		t.Run(fmt.Sprint("interpolateParams=", interpolate), func(t *testing.T) {
			t.Parallel()
			db, direct := ledgerDBWith(t, func(cfg *mysql.Config) { cfg.InterpolateParams = interpolate })
			leaseLostCommitsNothing(t, db, direct)
		})
	}
}

func leaseLostCommitsNothing(t *testing.T, db, direct *sql.DB) {
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: idempotency.ModeClaimFirst})
	require.NoError(t, err)
	takeOver := func(ctx context.Context) {
		// Another attempt takes the key over (as TakeOver does after the
		// lease expired): the record's owner and version change.
		_, err := direct.ExecContext(ctx, `UPDATE idempotency_record SET locked_by = 'successor', lease_version = lease_version + 1 WHERE idempotency_key = 'k'`)
		require.NoError(t, err)
	}
	a := mw.Do(context.Background(), idempotency.Action{Scope: "s", Key: "k", Fingerprint: "fp"}, appendLedgerRun(takeOver))
	require.NotEqual(t, http.StatusCreated, a.Status, "a lost lease is never answered 201")
	require.NotNil(t, a.Problem)
	require.Zero(t, ledgerRows(t, direct, "k"), "the fence stopped the transaction before its COMMIT")
	var owner, status string
	require.NoError(t, direct.QueryRow("SELECT locked_by, status FROM idempotency_record WHERE idempotency_key = 'k'").Scan(&owner, &status))
	require.Equal(t, []string{"successor", "PROCESSING"}, []string{owner, status}, "the successor's record is untouched")
}

// A handler's statement that holds several statements is refused before it
// reaches the server: the pool's multi-statement capability is for the
// record's batch only.
func TestOpenMySQL_AStatementHoldingSeveral_IsRefused(t *testing.T) {
	t.Parallel()
	db, direct := ledgerDB(t, nil)
	for _, q := range []string{
		"INSERT INTO ledger (idem_key) VALUES ('a'); DROP TABLE ledger",
		"SELECT 1; DROP TABLE ledger",
		"INSERT INTO ledger (idem_key) VALUES ('\\'); DROP TABLE ledger; -- ')",
	} {
		_, err := db.Exec(q)
		require.Error(t, err, q)
		_, err = db.Query(q)
		require.Error(t, err, q)
	}
	_, err := db.Exec("INSERT INTO ledger (idem_key) VALUES ('a;b'); ")
	require.NoError(t, err, "a ';' in a string, and a trailing one, are one statement")
	require.Equal(t, 1, ledgerRows(t, direct, "a;b"))
}

// Single-phase's batch (the record's INSERT and the COMMIT) cut by a
// failed connection: the request lost before the server read it commits
// nothing and is never answered 201; the reply lost after the server
// committed is answered 201 (the record says so). Either way a retry ends
// with exactly one row.
func TestOpenMySQL_TheBatchCutByTheConnection_AnswerMatchesWhatCommitted(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeSinglePhase} {
		for _, cut := range []batchCut{requestLost, replyLost} {
			t.Run(fmt.Sprintf("%s/%s", mode, cut), func(t *testing.T) {
				t.Parallel()
				d := &cuttingDialer{}
				db, direct := ledgerDB(t, d.dial)
				mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: mode, ReplayCacheBytes: -1})
				require.NoError(t, err)
				action := idempotency.Action{Scope: "s", Key: "k", Fingerprint: "fp"}
				d.arm(cut)
				first := mw.Do(context.Background(), action, appendLedgerRun(nil))
				require.True(t, d.fired(), "the batch was cut")
				committed := ledgerRows(t, direct, "k")
				if cut == requestLost {
					require.Zero(t, committed, "the batch never reached the server")
					require.NotEqual(t, http.StatusCreated, first.Status)
					require.NotNil(t, first.Problem)
				} else {
					require.Equal(t, 1, committed, "the server committed before the reply was lost")
					require.Equal(t, http.StatusCreated, first.Status, "%+v", first.Problem)
				}
				retry := mw.Do(context.Background(), action, appendLedgerRun(nil))
				require.Equal(t, http.StatusCreated, retry.Status, "%+v", retry.Problem)
				require.Equal(t, committed == 1, retry.Replayed)
				require.Equal(t, 1, ledgerRows(t, direct, "k"))
			})
		}
	}
}

type batchCut int

const (
	requestLost batchCut = iota + 1
	replyLost
)

func (c batchCut) String() string {
	if c == requestLost {
		return "request lost"
	}
	return "reply lost"
}

// cuttingDialer's connections cut the next batch that ends in COMMIT once
// armed: before it reaches the server, or after the server's whole reply
// to it (the COMMIT's included) has come, which the client never sees.
type cuttingDialer struct {
	mu    sync.Mutex
	armed batchCut
	done  bool
}

func (d *cuttingDialer) arm(c batchCut) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed, d.done = c, false
}

func (d *cuttingDialer) fired() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

// take consumes the armed cut if p is a COM_QUERY batch ending in COMMIT.
func (d *cuttingDialer) take(p []byte) batchCut {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed == 0 || len(p) < 5 || p[4] != 0x03 || !bytes.HasSuffix(p, []byte(";\nCOMMIT")) {
		return 0
	}
	c := d.armed
	d.armed, d.done = 0, true
	return c
}

func (d *cuttingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cuttingConn{Conn: c, d: d}, nil
}

type cuttingConn struct {
	net.Conn
	d         *cuttingDialer
	swallowed bool // the batch went; its reply is to be swallowed
}

var errCut = errors.New("cut by the test")

func (c *cuttingConn) Write(p []byte) (int, error) {
	switch c.d.take(p) {
	case requestLost:
		c.Conn.Close()
		return 0, errCut
	case replyLost:
		c.swallowed = true
	}
	return c.Conn.Write(p)
}

func (c *cuttingConn) Read(p []byte) (int, error) {
	if !c.swallowed {
		return c.Conn.Read(p)
	}
	// Read the server's replies, one per statement, until one that is not
	// followed by more (or an error): the COMMIT has been answered.
	for {
		var head [4]byte
		if _, err := io.ReadFull(c.Conn, head[:]); err != nil {
			return 0, err
		}
		payload := make([]byte, int(head[0])|int(head[1])<<8|int(head[2])<<16)
		if _, err := io.ReadFull(c.Conn, payload); err != nil {
			return 0, err
		}
		if payload[0] != 0x00 || !moreResults(payload) {
			c.Conn.Close()
			return 0, errCut
		}
	}
}

// moreResults reads an OK packet's SERVER_MORE_RESULTS_EXISTS flag.
func moreResults(ok []byte) bool {
	i := 1
	for range 2 { // affected rows, last insert id: length-encoded integers
		switch b := ok[i]; {
		case b < 0xfb:
			i++
		case b == 0xfc:
			i += 3
		case b == 0xfd:
			i += 4
		default:
			i += 9
		}
	}
	return ok[i]&0x08 != 0
}
