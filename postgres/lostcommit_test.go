package postgres_test

// A lost COMMIT on PostgreSQL: the ledger service behind the middleware,
// with the store and the business transactions reaching the server through
// internal/faultproxy, which loses the reply to a COMMIT, the COMMIT itself,
// or delivers it only after the client gave up. The specifications of the
// MariaDB chaos tests (chaos_test.go in the root package), on PostgreSQL.
//
// The invariant: the middleware never answers 2xx for a ledger entry that
// did not commit, never answers failure for one that did, and a key's entry
// is written at most once.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/faultproxy"
	"github.com/orderguard/idempotency/internal/history"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// lostCommitBundle is a testBundle whose middleware reaches PostgreSQL
// through the fault proxy; its db is a direct pool to the same schema, for
// the assertions.
type lostCommitBundle struct {
	*testBundle
	proxy   *faultproxy.Proxy
	appName string            // the application_name of the middleware's sessions
	hist    *history.Recorder // every request do sent (lostcommit_history_test.go)
}

// setupLostCommit is setup with the middleware's pool behind the proxy.
func setupLostCommit(t *testing.T, cfg idempotency.Config, svc *ledgerService) *lostCommitBundle {
	t.Helper()
	direct, dsn := pgtest.Postgres(t)
	require.NoError(t, postgres.Migrate(context.Background(), direct))
	_, err := direct.Exec(`CREATE TABLE account (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO account VALUES (1, 1000), (2, 1000);
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account bigint NOT NULL, amount bigint NOT NULL, idem_key text NOT NULL)`)
	require.NoError(t, err)

	proxy, app, appName := proxiedPool(t, dsn)
	store := postgres.NewStore(app)
	mw, err := idempotency.New(store, &cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(svc))
	t.Cleanup(srv.Close)
	b := &lostCommitBundle{testBundle: &testBundle{db: direct, store: store, svc: svc, srv: srv}, proxy: proxy, appName: appName,
		hist: history.NewRecorder()}
	t.Cleanup(func() { b.checkHistory(t) }) // before the database goes
	return b
}

// proxiedPool starts a fault proxy in front of the server dsn names and
// returns it with a pool whose connections go through it, and the
// application_name that marks the pool's sessions on the server.
func proxiedPool(t *testing.T, dsn string) (*faultproxy.Proxy, *sql.DB, string) {
	t.Helper()
	proxy, cfg := proxiedConfig(t, dsn)
	// The proxy must read the frontend messages: no TLS whatever the DSN's
	// sslmode (prefer, pgx's default, encrypts when the server can).
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	_, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	appName := "faultproxy-" + port
	cfg.RuntimeParams["application_name"] = appName
	app := pgtest.OpenDB(*cfg)
	app.SetMaxOpenConns(24)
	app.SetMaxIdleConns(24)
	t.Cleanup(func() { app.Close() })
	return proxy, app, appName
}

// proxiedConfig starts a PostgreSQL fault proxy in front of the server dsn
// names and returns it with dsn's connection config pointed at it.
func proxiedConfig(t *testing.T, dsn string) (*faultproxy.Proxy, *pgx.ConnConfig) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	require.NotContains(t, cfg.Host, "/", "the fault proxy forwards TCP, not a Unix socket")
	proxy, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
		faultproxy.WithProtocol(faultproxy.PostgreSQL))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })

	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.Host, cfg.Port = host, uint16(p)
	for _, fb := range cfg.Fallbacks {
		fb.Host, fb.Port = host, uint16(p)
	}
	return proxy, cfg
}

// fired waits for the armed fault to complete, then for the server to be
// done with the session it cut: a cut session may still be committing or
// rolling back when the proxy reports, and what it did must be settled
// before the test reads what committed. No request is running meanwhile, so
// every session of the middleware's pool must be idle.
func (b *lostCommitBundle) fired(t *testing.T, want faultproxy.Fault) {
	t.Helper()
	select {
	case f := <-b.proxy.Fired():
		require.Equal(t, want, f.Fault)
		require.Equal(t, "commit", f.Query, "pgx's (*sql.Tx).Commit")
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy never saw the COMMIT")
	}
	require.Eventually(t, func() bool {
		var busy int
		err := b.db.QueryRow("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'", b.appName).Scan(&busy)
		return err == nil && busy == 0
	}, 15*time.Second, 5*time.Millisecond, "the cut session ended")
}

// entriesFor counts the ledger rows written for key.
// lateCommitCancelled reports whether LateCommit's COMMIT failed to land:
// pgx sends a CancelRequest, on a new connection, for the connection the
// cut ended. It usually reaches the server before the late COMMIT and
// finds nothing to cancel; on a loaded machine it can arrive while the
// delivered statements run and cancel them ("canceling statement due to
// user request" in the server's log), and the transaction rolls back.
// Either way is a real outcome, and the answers must match it.
func (b *lostCommitBundle) lateCommitCancelled(t *testing.T, key string) bool {
	t.Helper()
	n := b.entriesFor(t, key)
	require.Contains(t, []int64{0, 1}, n, "entries for %s", key)
	if n == 0 {
		t.Log("pgx's cancel request rolled the late COMMIT's transaction back")
	}
	return n == 0
}

func (b *lostCommitBundle) entriesFor(t *testing.T, key string) int64 {
	t.Helper()
	return b.count(t, "SELECT COUNT(*) FROM ledger WHERE idem_key = $1", key)
}

// entryIDFor returns the id of the ledger row written for key.
func (b *lostCommitBundle) entryIDFor(t *testing.T, key string) int64 {
	t.Helper()
	return b.count(t, "SELECT id FROM ledger WHERE idem_key = $1", key)
}

var ledgerIDPattern = regexp.MustCompile(`^\{"ledger_id":(\d+),`)

// ledgerID returns the ledger id a 201 answered.
func ledgerID(t *testing.T, a answer) int64 {
	t.Helper()
	m := ledgerIDPattern.FindStringSubmatch(a.Body)
	require.NotNil(t, m, "not a ledger entry: %s", a.Body)
	id, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return id
}

// problemKind returns a problem answer's type, or "" for any other answer.
func problemKind(a answer) string {
	if a.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	if json.Unmarshal([]byte(a.Body), &p) != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

// retryUntilCreated retries until the answer is 201, accepting on the way
// only in-progress (the first attempt's claim still holds the key) and, in
// single-phase mode, 503 with Retry-After (its run met the first attempt's
// transaction still open); it fails at deadline.
func (b *lostCommitBundle) retryUntilCreated(t *testing.T, mode idempotency.Mode, key, body string, deadline time.Time) (answer, int) {
	t.Helper()
	for tries := 1; ; tries++ {
		a := b.do(t, key, body)
		switch {
		case a.Status == http.StatusCreated:
			return a, tries
		case a.Status == http.StatusConflict:
			require.Equal(t, idempotency.ProblemInProgress, a.problemType(t), a.Body)
		case a.Status == http.StatusServiceUnavailable && mode == idempotency.ModeSinglePhase:
			require.NotEmpty(t, a.Header.Get("Retry-After"), a.Body)
		default:
			t.Fatalf("try %d: only in-progress may precede the entry: %d %s", tries, a.Status, a.Body)
		}
		require.True(t, time.Now().Before(deadline), "the retry never created the entry (%d tries): %s", tries, a.Body)
		time.Sleep(100 * time.Millisecond)
	}
}

// The premise of these specifications: pgx sends (*sql.Tx).Commit as a
// simple query "commit" that the proxy recognises, and each fault leaves the
// server in the state it is named for.
func TestFaultProxy_Postgres_PgxCommitIsLostAsArmed(t *testing.T) {
	t.Parallel()
	direct, dsn := pgtest.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := direct.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	proxy, proxied, _ := proxiedPool(t, dsn)

	for id, fault := range []faultproxy.Fault{faultproxy.ReplyLost, faultproxy.RequestLost, faultproxy.LateCommit} {
		tx, err := proxied.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES ($1)", id)
		require.NoError(t, err)
		proxy.Arm(fault)
		require.Error(t, tx.Commit(), fault.String())
		select {
		case f := <-proxy.Fired():
			require.Equal(t, fault, f.Fault)
			require.Equal(t, "commit", f.Query)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the proxy never saw the COMMIT", fault)
		}

		// Inserting the same id again on the direct pool tells the outcome:
		// a unique violation if the COMMIT took effect; success if it did
		// not (once the server has rolled the dead session back, which the
		// insert waits for).
		_, err = direct.ExecContext(ctx, "INSERT INTO t VALUES ($1)", id)
		var pe *pgconn.PgError
		if fault != faultproxy.RequestLost {
			require.True(t, errors.As(err, &pe) && pe.Code == "23505", "%s: the commit took effect: %v", fault, err)
		} else {
			require.NoError(t, err, "the commit never reached the server")
		}
	}
	// The proxy still serves after its faults.
	require.NoError(t, proxied.PingContext(ctx))
	var n int
	require.NoError(t, proxied.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 3, n)
}

// With sslmode=prefer pgx opens with an SSLRequest. A server with TLS
// accepts it and the session is encrypted: the proxy passes it through
// unparsed and its fault never fires (hence sslmode=disable for the specs).
// A server without TLS refuses it ('N') and the COMMIT that follows the
// StartupMessage is lost as armed.
func TestFaultProxy_Postgres_SSLModePrefer_FaultFiresOnlyWhenTheServerRefusesTLS(t *testing.T) {
	t.Parallel()
	direct, dsn := pgtest.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := direct.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	proxy, cfg := proxiedConfig(t, pgtest.WithParams(t, dsn, map[string]string{"sslmode": "prefer"}))
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var encrypted bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&encrypted))

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	proxy.Arm(faultproxy.RequestLost)
	err = tx.Commit(ctx)
	var n int
	require.NoError(t, direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n))
	if encrypted {
		t.Log("the server accepted TLS: the proxy cannot see the COMMIT")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, faultproxy.RequestLost, proxy.Armed(), "nothing fired")
		require.Len(t, proxy.Fired(), 0)
		return
	}
	t.Log("the server refused TLS: the session is plain")
	require.Error(t, err)
	require.Equal(t, faultproxy.RequestLost, (<-proxy.Fired()).Fault)
	require.Equal(t, 0, n)
}

func TestChaos_CommitReplyLost_CommittedOrderIsAnswered201AndRetryReplaysIt(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupLostCommit(t, idempotency.Config{Mode: mode, Lease: 2 * time.Second}, &ledgerService{})
		const key, body = "reply-lost", `{"account":1,"amount":30}`

		b.proxy.Arm(faultproxy.ReplyLost)
		first := b.do(t, key, body)
		b.fired(t, faultproxy.ReplyLost)

		// The server committed; the client must hear so, with the entry
		// that committed (read again on a fresh connection).
		require.EqualValues(t, 1, b.entriesFor(t, key))
		require.Equal(t, http.StatusCreated, first.Status, "a committed entry answered as a failure: %s", first.Body)
		require.Equal(t, b.entryIDFor(t, key), ledgerID(t, first))
		require.Equal(t, fmt.Sprint("/ledger/", ledgerID(t, first)), first.Header.Get("Location"))
		require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key = $1 AND status = 'DONE'", key))

		again := b.do(t, key, body)
		require.Equal(t, http.StatusCreated, again.Status, again.Body)
		require.Equal(t, first.Body, again.Body, "a replay is the first answer, byte for byte")
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "a replay is marked Idempotent-Replayed: %s", again.Body)
		require.EqualValues(t, 1, b.svc.runs.Load(), "the handler ran once")
		require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
		require.EqualValues(t, 970, b.count(t, "SELECT balance FROM account WHERE id = 1"), "debited once")
	})
}

func TestChaos_CommitRequestLost_Answers503WithNoOrderAndRetryCreatesItOnce(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		const lease = 2 * time.Second
		b := setupLostCommit(t, idempotency.Config{Mode: mode, Lease: lease}, &ledgerService{})
		const key, body = "request-lost", `{"account":1,"amount":40}`

		b.proxy.Arm(faultproxy.RequestLost)
		first := b.do(t, key, body)
		answered := time.Now()
		b.fired(t, faultproxy.RequestLost)

		// Nothing committed; the client must not hear 2xx.
		require.EqualValues(t, 0, b.entriesFor(t, key))
		require.EqualValues(t, 1000, b.count(t, "SELECT balance FROM account WHERE id = 1"))
		require.Equal(t, http.StatusServiceUnavailable, first.Status, "an uncommitted entry must be answered 503: %s", first.Body)
		require.NotEmpty(t, first.Header.Get("Retry-After"))
		switch kind := first.problemType(t); kind {
		case idempotency.ProblemStoreUnavailable:
			// Resolved: the fenced release deleted the claim, so the key is free.
			require.EqualValues(t, 0, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key = $1", key))
		case idempotency.ProblemCommitUnknown:
			// Unresolved: a claim stays until its lease ends.
		default:
			t.Fatalf("an uncommitted entry must be answered store-unavailable or commit-outcome-unknown, got %s: %s", kind, first.Body)
		}
		t.Logf("first answer: %d %s", first.Status, first.problemType(t))

		retry, tries := b.retryUntilCreated(t, mode, key, body, answered.Add(lease+5*time.Second))
		t.Logf("the retry created the entry after %d tries", tries)
		require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "the retry executed")
		require.EqualValues(t, 1, b.entriesFor(t, key))
		require.Equal(t, b.entryIDFor(t, key), ledgerID(t, retry))
		require.EqualValues(t, 2, b.svc.runs.Load(), "the lost attempt and the retry")

		again := b.do(t, key, body)
		require.Equal(t, retry.Body, again.Body, "a replay is the first answer, byte for byte")
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "a replay is marked Idempotent-Replayed: %s", again.Body)
		require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
		require.EqualValues(t, 960, b.count(t, "SELECT balance FROM account WHERE id = 1"), "debited once")
	})
}

func TestChaos_CommitLandsAfterTheClientGaveUp_CommittedOrderIsAnswered201(t *testing.T) {
	t.Parallel()
	b := setupLostCommit(t, idempotency.Config{Lease: 5 * time.Second}, &ledgerService{})
	const key, body = "late-commit", `{"account":2,"amount":50}`

	// The driver's COMMIT fails at once; the server receives it 500ms
	// later. Meanwhile the middleware reads the record (still PROCESSING,
	// ours) and tries its fenced release, which waits for the transaction's
	// lock and then matches nothing, because the commit landed.
	b.proxy.SetReplyDelay(500 * time.Millisecond)
	b.proxy.Arm(faultproxy.LateCommit)
	first := b.do(t, key, body)
	b.fired(t, faultproxy.LateCommit)

	runs := int32(1)
	if b.lateCommitCancelled(t, key) {
		// Nothing committed: a retry executes once (after the lease,
		// if the release could not free the key), and is the first
		// answer below.
		require.Equal(t, http.StatusServiceUnavailable, first.Status, first.Body)
		require.Contains(t, []string{idempotency.ProblemStoreUnavailable, idempotency.ProblemCommitUnknown}, first.problemType(t))
		first, _ = b.retryUntilCreated(t, idempotency.ModeClaimFirst, key, body, time.Now().Add(10*time.Second))
		require.Empty(t, first.Header.Get("Idempotent-Replayed"), "the retry executed")
		runs = 2 // the cancelled attempt and the retry
	}
	require.EqualValues(t, 1, b.entriesFor(t, key))
	require.Equal(t, http.StatusCreated, first.Status, "a committed entry answered as a failure: %s", first.Body)
	require.Equal(t, b.entryIDFor(t, key), ledgerID(t, first))

	again := b.do(t, key, body)
	require.Equal(t, http.StatusCreated, again.Status, again.Body)
	require.Equal(t, first.Body, again.Body, "a replay is the first answer, byte for byte")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "a replay is marked Idempotent-Replayed: %s", again.Body)
	require.Equal(t, runs, b.svc.runs.Load(), "the handler ran once, or again after the cancelled attempt")
	require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
	require.EqualValues(t, 950, b.count(t, "SELECT balance FROM account WHERE id = 2"), "debited once")
}

// Single-phase has no claim to fence: a re-read that finds no record cannot
// tell a lost COMMIT from a late one, so the client hears that the outcome
// is unknown, and the retry, whose own record insert waits for the late
// transaction, replays the entry it committed.
func TestChaos_SinglePhase_CommitLandsAfterTheClientGaveUp_AnsweredUnknownAndTheRetryReplaysIt(t *testing.T) {
	t.Parallel()
	const lease = 5 * time.Second
	b := setupLostCommit(t, idempotency.Config{Mode: idempotency.ModeSinglePhase, Lease: lease}, &ledgerService{})
	const key, body = "late-commit", `{"account":2,"amount":50}`

	b.proxy.SetReplyDelay(500 * time.Millisecond)
	b.proxy.Arm(faultproxy.LateCommit)
	first := b.do(t, key, body)
	answered := time.Now()
	b.fired(t, faultproxy.LateCommit)
	if b.lateCommitCancelled(t, key) {
		// Nothing committed: the client heard the outcome is unknown, and
		// the retry executes once.
		require.Equal(t, http.StatusServiceUnavailable, first.Status, first.Body)
		require.Equal(t, idempotency.ProblemCommitUnknown, first.problemType(t))
		retry, tries := b.retryUntilCreated(t, idempotency.ModeSinglePhase, key, body, answered.Add(lease+5*time.Second))
		t.Logf("the retry created the entry after %d tries", tries)
		require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "the retry executed")
		require.EqualValues(t, 1, b.entriesFor(t, key))
		require.Equal(t, b.entryIDFor(t, key), ledgerID(t, retry))
		require.EqualValues(t, 950, b.count(t, "SELECT balance FROM account WHERE id = 2"), "debited once")
		return
	}
	require.EqualValues(t, 1, b.entriesFor(t, key))
	if first.Status == http.StatusCreated {
		// The re-read came after the late COMMIT (a loaded machine).
		t.Log("the re-read found the committed record")
		require.Equal(t, b.entryIDFor(t, key), ledgerID(t, first))
	} else {
		require.Equal(t, http.StatusServiceUnavailable, first.Status, first.Body)
		require.Equal(t, idempotency.ProblemCommitUnknown, first.problemType(t))
		require.NotEmpty(t, first.Header.Get("Retry-After"))
	}

	retry, tries := b.retryUntilCreated(t, idempotency.ModeSinglePhase, key, body, answered.Add(lease+5*time.Second))
	t.Logf("the retry got the entry after %d tries", tries)
	require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"), "a replay is marked Idempotent-Replayed: %s", retry.Body)
	require.Equal(t, b.entryIDFor(t, key), ledgerID(t, retry))
	if first.Status == http.StatusCreated {
		require.Equal(t, first.Body, retry.Body, "a replay is the first answer, byte for byte")
	}
	again := b.do(t, key, body)
	require.Equal(t, retry.Body, again.Body, "a replay is the first answer, byte for byte")
	require.EqualValues(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
	require.EqualValues(t, 950, b.count(t, "SELECT balance FROM account WHERE id = 2"), "debited once")
}

// The COMMIT cut at every moment around the server's commit: before, while
// and after the server commits, so that the middleware's re-read sees the
// record before or after the commit. Every answer must still match what the
// database holds.
func TestChaos_CommitCutAtAnyMoment_AnswerAlwaysMatchesWhatCommitted(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		const lease = 2 * time.Second
		b := setupLostCommit(t, idempotency.Config{Mode: mode, Lease: lease}, &ledgerService{})
		cuts := []struct {
			fault faultproxy.Fault
			delay time.Duration
		}{
			{faultproxy.ReplyLost, 0},
			{faultproxy.ReplyLost, 500 * time.Microsecond},
			{faultproxy.ReplyLost, 2 * time.Millisecond},
			{faultproxy.ReplyLost, 20 * time.Millisecond},
			{faultproxy.RequestLost, 0},
			{faultproxy.LateCommit, 0},
			{faultproxy.LateCommit, 5 * time.Millisecond},
			{faultproxy.LateCommit, 50 * time.Millisecond},
			// Later than the lease: in claim-first the fenced release waits
			// for the transaction's lock until the commit lands (finalizing
			// has its own bound, longer than the lease); in single-phase the
			// outcome stays unknown (503) and the retry must find the entry
			// the late COMMIT committed, meeting the open transaction on
			// its way.
			{faultproxy.LateCommit, lease + 500*time.Millisecond},
		}
		outcomes := map[string]int{}
		var keys int64
		for round := range 3 {
			for i, c := range cuts {
				key := fmt.Sprintf("cut-%d-%d", round, i)
				body := fmt.Sprintf(`{"account":%d,"amount":1}`, 1+i%2)
				name := fmt.Sprintf("%s after %v", c.fault, c.delay)
				runs := b.svc.runs.Load()

				b.proxy.SetReplyDelay(c.delay)
				b.proxy.Arm(c.fault)
				first := b.do(t, key, body)
				answered := time.Now()
				require.Equal(t, faultproxy.None, b.proxy.Armed(), "%s: the COMMIT was cut", name)
				b.fired(t, c.fault) // the fault is complete: the first attempt's fate is sealed
				keys++

				committed := b.entriesFor(t, key)
				kind := problemKind(first)
				outcomes[fmt.Sprintf("%s: %d %s", name, first.Status, kind)]++
				switch {
				case first.Status == http.StatusCreated:
					require.EqualValues(t, 1, committed, "%s: 201 for an entry that did not commit", name)
					require.Equal(t, b.entryIDFor(t, key), ledgerID(t, first), name)
				case first.Status == http.StatusServiceUnavailable && kind == idempotency.ProblemStoreUnavailable:
					require.EqualValues(t, 0, committed, "%s: failure answered for a committed entry", name)
				case first.Status == http.StatusServiceUnavailable && kind == idempotency.ProblemCommitUnknown:
					// Either may be true; the retry must tell.
				default:
					t.Fatalf("%s: unexpected answer %d: %s", name, first.Status, first.Body)
				}
				if c.fault == faultproxy.RequestLost {
					require.EqualValues(t, 0, committed, "%s: the COMMIT never reached the server", name)
					require.NotEqual(t, http.StatusCreated, first.Status, name)
				}

				retry, _ := b.retryUntilCreated(t, mode, key, body, answered.Add(lease+5*time.Second))
				require.EqualValues(t, 1, b.entriesFor(t, key), name)
				require.Equal(t, b.entryIDFor(t, key), ledgerID(t, retry), name)
				if committed == 1 {
					require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"), "%s: the retry replays the committed entry", name)
					if mode == idempotency.ModeClaimFirst {
						require.EqualValues(t, 1, b.svc.runs.Load()-runs, "%s: a committed entry executed again", name)
					}
				} else {
					require.Empty(t, retry.Header.Get("Idempotent-Replayed"), name)
				}
				require.EqualValues(t, keys, b.count(t, "SELECT COUNT(*) FROM ledger"), "%s: one entry per key", name)
			}
		}
		require.EqualValues(t, 2000-keys, b.count(t, "SELECT SUM(balance) FROM account"), "each key debited once")
		for _, o := range slices.Sorted(maps.Keys(outcomes)) {
			t.Logf("%dx %s", outcomes[o], o)
		}
	})
}
