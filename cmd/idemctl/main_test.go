package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/sqlite"
)

// result is what one idemctl invocation did.
type result struct {
	code           int
	stdout, stderr string
}

// idemctl runs the CLI in-process with stdin as its input.
func idemctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return idemctlFrom(t, strings.NewReader(stdin), args...)
}

func idemctlFrom(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, stdin, &stdout, &stderr)
	t.Logf("idemctl %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// mysqlStore returns a fresh, migrated MariaDB database: its store, its
// handle and the --db URL naming it.
func mysqlStore(t *testing.T) (*idempotency.SQLStore, *sql.DB, string) {
	t.Helper()
	db, dsn := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	return idempotency.NewMySQLStore(db), db, "mysql://" + dsn
}

var ctx = context.Background()

func orderSnapshot() *idempotency.Snapshot {
	return &idempotency.Snapshot{
		StatusCode: http.StatusCreated,
		Header:     http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/o-1"}},
		Body:       []byte(`{"order_id":"o-1"}`),
	}
}

// claim makes a PROCESSING record held for lease.
func claim(t *testing.T, s idempotency.Store, key string, lease time.Duration) idempotency.Lease {
	t.Helper()
	l, err := s.Claim(ctx, idempotency.Claim{
		Scope: "tenant-1", Key: key, Fingerprint: "fp-" + key, Owner: "host-a/" + key,
		Lease: lease, Retention: time.Hour,
	})
	require.NoError(t, err)
	return l
}

// final makes a final record kept for retention.
func final(t *testing.T, s idempotency.Store, key string, st idempotency.Status, retention time.Duration) idempotency.Lease {
	t.Helper()
	l, err := s.Finish(ctx, claim(t, s, key, time.Hour), st, orderSnapshot(), retention)
	require.NoError(t, err)
	return l
}

func requireGone(t *testing.T, s idempotency.Store, key string) {
	t.Helper()
	_, err := s.Lookup(ctx, "tenant-1", key)
	require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
}

func requireRecord(t *testing.T, s idempotency.Store, key string, st idempotency.Status, version int64) {
	t.Helper()
	rec, err := s.Lookup(ctx, "tenant-1", key)
	require.NoError(t, err)
	require.Equal(t, st, rec.Status)
	require.Equal(t, version, rec.Version)
}

func TestMigrate_CreatesTheTables_AndIsSafeToRepeat(t *testing.T) {
	t.Parallel()
	db, dsn := testdb.MySQL(t)

	for range 2 {
		r := idemctl(t, "", "--db", "mysql://"+dsn, "migrate")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stdout, "schema at version 005_payments")
	}
	var tables int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name IN ('idempotency_record', 'schema_migrations')`).Scan(&tables))
	require.Equal(t, 2, tables)
}

func TestStats_JSONCountsStatesExpiredLeasesAndPurgeBacklog(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "live-1", time.Hour)
	claim(t, s, "live-2", time.Hour)
	claim(t, s, "dead", time.Microsecond)
	final(t, s, "done-kept", idempotency.StatusDone, time.Hour)
	final(t, s, "done-expired", idempotency.StatusDone, time.Microsecond)
	final(t, s, "failed-expired", idempotency.StatusFailed, time.Microsecond)
	time.Sleep(20 * time.Millisecond)

	r := idemctl(t, "", "--db", dbURL, "stats", "--json")
	require.Equal(t, exitOK, r.code)
	var got statsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Equal(t, map[idempotency.Status]int64{"PROCESSING": 3, "DONE": 2, "FAILED": 1}, got.ByStatus)
	require.EqualValues(t, 6, got.Total)
	require.EqualValues(t, 1, got.ExpiredLeases)
	require.EqualValues(t, 2, got.AwaitingPurge)
	require.Greater(t, got.OldestProcessingSeconds, 0.0)
	require.NotEqual(t, "none", got.OldestProcessing)
	require.NotNil(t, got.TableBytes)
	require.Positive(t, *got.TableBytes)
	require.Contains(t, got.TableSize, "KiB")
}

func TestStats_TextListsEveryStateWithHumanReadableSize(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "done", idempotency.StatusDone, time.Hour)

	r := idemctl(t, "", "--db", dbURL, "stats")
	require.Equal(t, exitOK, r.code)
	require.Regexp(t, `PROCESSING\s+0\n`, r.stdout)
	require.Regexp(t, `DONE\s+1\n`, r.stdout)
	require.Regexp(t, `FAILED\s+0\n`, r.stdout)
	require.Regexp(t, `total\s+1\n`, r.stdout)
	require.Contains(t, r.stdout, "oldest PROCESSING:  none")
	require.Regexp(t, `table size:\s+\d+\.\d KiB`, r.stdout)
}

func TestInspect_DoneRecord_ShowsEveryFieldButNotTheBody(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "k1", idempotency.StatusDone, time.Hour)

	r := idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "k1")
	require.Equal(t, exitOK, r.code)
	for _, want := range []string{
		`scope:          "tenant-1"`,
		`key:            "k1"`,
		"key hash:       " + idempotency.KeyHash("tenant-1", "k1"),
		"state:          DONE",
		"owner:          host-a/k1",
		"lease version:  2",
		"locked until:   - (final: no lease)",
		"retention running",
		"fingerprint:    fp-k1",
		"response:       201 Created",
		"headers:        Content-Type: application/json",
		"                Location: /orders/o-1",
		"body:           18 bytes (--body prints it)",
	} {
		require.Contains(t, r.stdout, want)
	}
	require.NotContains(t, r.stdout, "order_id")
	require.Empty(t, r.stderr)

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "k1", "--body")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "body:           18 bytes:\n"+`{"order_id":"o-1"}`+"\n")
}

func TestInspect_JSON_ReportsTheRecordAndOmitsTheBodyUnlessAsked(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "k1", idempotency.StatusFailed, time.Hour)

	r := idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "k1", "--json")
	require.Equal(t, exitOK, r.code)
	var got recordJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Equal(t, "tenant-1", got.Scope)
	require.Equal(t, "k1", got.Key)
	require.Equal(t, "FAILED", got.State)
	require.Equal(t, "host-a/k1", got.Owner)
	require.EqualValues(t, 2, got.LeaseVersion)
	require.Nil(t, got.LockedUntil, "a final record has no lease")
	require.Nil(t, got.LeaseExpired)
	require.False(t, got.Expired)
	require.True(t, got.ExpiresAt.After(got.ReadAt))
	require.False(t, got.CreatedAt.IsZero())
	require.False(t, got.UpdatedAt.Before(got.CreatedAt))
	require.Equal(t, "fp-k1", got.Fingerprint)
	require.NotNil(t, got.Response)
	require.Equal(t, 201, got.Response.StatusCode)
	require.Equal(t, "/orders/o-1", got.Response.Headers.Get("Location"))
	require.Equal(t, 18, got.Response.BodyBytes)
	require.Nil(t, got.Response.Body)
	require.NotContains(t, r.stdout, "order_id")

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "k1", "--json", "--body")
	require.Equal(t, exitOK, r.code)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.NotNil(t, got.Response.Body)
	require.Equal(t, `{"order_id":"o-1"}`, *got.Response.Body)
}

func TestInspect_ProcessingRecord_ShowsWhetherTheLeaseExpired(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "held", time.Hour)
	claim(t, s, "dead", time.Microsecond)
	time.Sleep(20 * time.Millisecond)

	r := idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "held")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "state:          PROCESSING")
	require.Regexp(t, `locked until:\s+\S+ \(in \S+: lease held\)`, r.stdout)
	require.Contains(t, r.stdout, "response:       none yet")

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "dead", "--json")
	require.Equal(t, exitOK, r.code)
	var got recordJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Equal(t, "PROCESSING", got.State)
	require.NotNil(t, got.LeaseExpired)
	require.True(t, *got.LeaseExpired)
	require.NotNil(t, got.LockedUntil)
	require.Nil(t, got.Response)

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "dead")
	require.Regexp(t, `locked until:\s+\S+ \(\S+ ago: lease EXPIRED\)`, r.stdout)
}

func TestInspect_UnknownKey_ExitsNotFoundNamingScopeAndKey(t *testing.T) {
	t.Parallel()
	_, _, dbURL := mysqlStore(t)

	r := idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "missing")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.stderr, `no record for scope "tenant-1" key "missing"`)
	require.NotContains(t, r.stderr, "sql:")
	require.Empty(t, r.stdout)
}

func TestRelease_WithYes_DeletesTheProcessingRecord(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "stuck", time.Microsecond)

	r := idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck", "--yes")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "state:          PROCESSING")
	require.Contains(t, r.stdout, `released scope "tenant-1" key "stuck" (owner host-a/stuck, lease version 1)`)
	requireGone(t, s, "stuck")
}

func TestRelease_AnsweredNo_RefusesAndKeepsTheRecord(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "stuck", time.Hour)

	r := idemctl(t, "no\n", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck")
	require.Equal(t, exitRefused, r.code)
	require.Contains(t, r.stderr, "Type yes to release")
	require.Contains(t, r.stderr, "not released")
	requireRecord(t, s, "stuck", idempotency.StatusProcessing, 1)

	r = idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck")
	require.Equal(t, exitRefused, r.code, "end of input is no confirmation")
	requireRecord(t, s, "stuck", idempotency.StatusProcessing, 1)
}

func TestRelease_AnsweredYes_WarnsThenDeletesTheRecord(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "stuck", time.Microsecond)

	r := idemctl(t, "yes\n", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stderr, "EXECUTES AGAIN")
	require.Contains(t, r.stderr, "known to be dead AND whose effect (the order) is known to be absent")
	require.Contains(t, r.stderr, "let the reconciler decide")
	require.Contains(t, r.stdout, "released")
	requireGone(t, s, "stuck")
}

func TestRelease_HeldLease_WarnsTheAttemptMayStillRun(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "busy", time.Hour)

	r := idemctl(t, "no\n", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "busy")
	require.Equal(t, exitRefused, r.code)
	require.Contains(t, r.stderr, "the attempt may still be running")
}

func TestRelease_DoneRecord_IsRefusedAndUntouched(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "done", idempotency.StatusDone, time.Hour)

	r := idemctl(t, "yes\n", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "done", "--yes")
	require.Equal(t, exitRefused, r.code)
	require.Contains(t, r.stderr, "the record is DONE, not PROCESSING")
	requireRecord(t, s, "done", idempotency.StatusDone, 2)
}

// onFirstRead runs before once, when the CLI first reads its input (on a
// goroutine of its own).
type onFirstRead struct {
	r      io.Reader
	before func()
	once   sync.Once
}

func (o *onFirstRead) Read(p []byte) (int, error) {
	o.once.Do(o.before)
	return o.r.Read(p)
}

func TestRelease_RecordChangedBeforeConfirmation_IsFencedOutAndKept(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	l := claim(t, s, "racy", time.Hour)

	// While the operator reads the prompt, the attempt heartbeats: the
	// lease version moves on, so the release must match nothing.
	var extendErr error
	stdin := &onFirstRead{r: strings.NewReader("yes\n"), before: func() {
		_, extendErr = s.Extend(ctx, l, time.Hour)
	}}
	r := idemctlFrom(t, stdin, "--db", dbURL, "release", "--scope", "tenant-1", "--key", "racy")
	require.NoError(t, extendErr)
	require.Equal(t, exitRefused, r.code)
	require.Contains(t, r.stderr, "the record changed since it was read")
	requireRecord(t, s, "racy", idempotency.StatusProcessing, 2)
}

func TestRelease_UnknownKey_ExitsNotFound(t *testing.T) {
	t.Parallel()
	_, _, dbURL := mysqlStore(t)

	r := idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "missing", "--yes")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.stderr, `no record for scope "tenant-1" key "missing"`)
}

func TestPurge_Default_DeletesOnlyFinalRecordsPastRetention(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	claim(t, s, "dead", time.Microsecond)
	final(t, s, "kept", idempotency.StatusDone, time.Hour)
	final(t, s, "done-expired", idempotency.StatusDone, time.Microsecond)
	final(t, s, "failed-expired", idempotency.StatusFailed, time.Microsecond)
	time.Sleep(20 * time.Millisecond)

	r := idemctl(t, "", "--db", dbURL, "purge")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "purged 2 final records past their retention\n", r.stdout)
	requireGone(t, s, "done-expired")
	requireGone(t, s, "failed-expired")
	requireRecord(t, s, "kept", idempotency.StatusDone, 2)
	requireRecord(t, s, "dead", idempotency.StatusProcessing, 1)

	r = idemctl(t, "", "--db", dbURL, "purge")
	require.Equal(t, "purged 0 final records past their retention\n", r.stdout)
}

func TestPurge_OlderThan_DeletesFinalRecordsCreatedBeforeTheCutoffWhateverTheirRetention(t *testing.T) {
	t.Parallel()
	s, db, dbURL := mysqlStore(t)
	claim(t, s, "old-processing", time.Hour)
	final(t, s, "old-done", idempotency.StatusDone, 30*24*time.Hour)
	final(t, s, "old-failed", idempotency.StatusFailed, 30*24*time.Hour)
	final(t, s, "new-done", idempotency.StatusDone, 30*24*time.Hour)
	_, err := db.Exec(`UPDATE idempotency_record SET created_at = created_at - INTERVAL 4 DAY
WHERE idempotency_key IN ('old-processing', 'old-done', 'old-failed')`)
	require.NoError(t, err)

	r := idemctl(t, "", "--db", dbURL, "purge", "--older-than", "72h")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "purged 2 final records created more than 72h0m0s ago\n", r.stdout)
	requireGone(t, s, "old-done")
	requireGone(t, s, "old-failed")
	requireRecord(t, s, "old-processing", idempotency.StatusProcessing, 1)
	requireRecord(t, s, "new-done", idempotency.StatusDone, 2)
}

func TestPurge_NonPositiveOlderThan_IsAUsageError(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"0s", "-1h", "banana"} {
		r := idemctl(t, "", "--db", "sqlite:///nonexistent/never-opened.db", "purge", "--older-than", d)
		require.Equal(t, exitUsage, r.code, d)
	}
}

func TestBadDatabaseURL_ExitsCannotConnectAndSaysHowToWriteIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		want      []string
	}{
		{"unknown scheme", "nope://x", []string{`unknown scheme "nope"`, "mysql://USER[:PASSWORD]@tcp(HOST:PORT)/DBNAME", "sqlite://PATH"}},
		{"no scheme", "root@tcp(127.0.0.1:3306)/test", []string{"no scheme", "mysql://USER"}},
		{"unreachable server", "mysql://root@tcp(127.0.0.1:1)/test", []string{"cannot connect", "127.0.0.1:1", "check that the server runs"}},
		{"unterminated address", "mysql://root@tcp(127.0.0.1:3306/test", []string{"malformed MySQL DSN", "mysql://USER[:PASSWORD]@tcp(HOST:PORT)/DBNAME"}},
		{"URL-style address", "mysql://root:pw@127.0.0.1:3306/test", []string{"malformed MySQL DSN", "inside tcp(...)"}},
		{"no database name", "mysql://root@tcp(127.0.0.1:3306)/", []string{"names no database"}},
		{"empty sqlite path", "sqlite://", []string{"needs a file path"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := idemctl(t, "", "--db", tc.url, "stats")
			require.Equal(t, exitConnect, r.code)
			for _, w := range tc.want {
				require.Contains(t, r.stderr, w)
			}
			require.NotContains(t, r.stderr, ":pw@", "the password is never echoed")
		})
	}
}

func TestMissingSQLiteFile_ExitsCannotConnectWithoutCreatingIt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "absent.db")

	r := idemctl(t, "", "--db", "sqlite://"+path, "inspect", "--key", "k")
	require.Equal(t, exitConnect, r.code)
	require.Contains(t, r.stderr, "no SQLite database at "+path)
	_, err := os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestUnmigratedDatabase_FailsWithAHintToMigrate(t *testing.T) {
	t.Parallel()
	_, dsn := testdb.MySQL(t)

	r := idemctl(t, "", "--db", "mysql://"+dsn, "stats")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "run idemctl migrate")
}

func TestUsageErrors_ExitOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command given"},
		{"only global flags", []string{"--db", "nope://x"}, "no command given"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown global flag", []string{"--bogus", "stats"}, "flag provided but not defined: -bogus"},
		{"unknown command flag", []string{"stats", "--bogus"}, "flag provided but not defined: -bogus"},
		{"inspect without --key", []string{"inspect", "--scope", "s"}, "--key is required"},
		{"release without --key", []string{"release", "--yes"}, "--key is required"},
		{"positional argument", []string{"inspect", "--key", "k", "extra"}, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := idemctl(t, "", tc.args...)
			require.Equal(t, exitUsage, r.code)
			require.Contains(t, r.stderr, tc.want)
		})
	}
}

func TestNoDatabaseURL_IsAUsageErrorNamingFlagAndVariable(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}

	require.Equal(t, exitUsage, c.run([]string{"stats"}))
	require.Contains(t, stderr.String(), "pass --db URL or set IDEMCTL_DB")
}

func TestDatabaseURL_ComesFromIDEMCTL_DBWhenNoFlagIsGiven(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "k", idempotency.StatusDone, time.Hour)
	var stdout, stderr strings.Builder
	env := map[string]string{"IDEMCTL_DB": dbURL}
	c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return env[k] }}

	require.Equal(t, exitOK, c.run([]string{"inspect", "--scope", "tenant-1", "--key", "k"}), stderr.String())
	require.Contains(t, stdout.String(), "state:          DONE")

	// The flag wins over the variable.
	stderr.Reset()
	require.Equal(t, exitConnect, c.run([]string{"--db", "nope://x", "stats"}))
	require.Contains(t, stderr.String(), `unknown scheme "nope"`)
}

func TestDatabaseFlag_MayFollowTheCommand(t *testing.T) {
	t.Parallel()
	s, _, dbURL := mysqlStore(t)
	final(t, s, "k", idempotency.StatusDone, time.Hour)

	r := idemctl(t, "", "inspect", "--key", "k", "--db", dbURL, "--scope", "tenant-1")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "state:          DONE")
}

func TestHelp_PrintsUsageAndExitCodes(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"--db", "nope://x", "help"}} {
		r := idemctl(t, "", args...)
		require.Equal(t, exitOK, r.code)
		require.Equal(t, usage, r.stdout)
	}
	for _, want := range []string{"migrate", "stats", "inspect", "release", "purge", "IDEMCTL_DB",
		"0  success", "1  usage error", "2  cannot connect", "3  not found", "4  refused", "5  any other failure"} {
		require.Contains(t, usage, want)
	}

	// --help is asked for: the same text on stdout, exit 0, as "help".
	for _, flag := range []string{"--help", "-h", "-help"} {
		r := idemctl(t, "", flag)
		require.Equal(t, exitOK, r.code, flag)
		require.Equal(t, usage, r.stdout, "%s prints the usage to stdout", flag)
		require.Empty(t, r.stderr, flag)
	}
	r := idemctl(t, "", "inspect", "-h")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "usage: idemctl [--db URL] inspect --scope S --key K")
	require.Contains(t, r.stdout, "-scope string")
	require.Empty(t, r.stderr)

	// A bad flag is a usage error: the reason and the usage on stderr.
	r = idemctl(t, "", "--nope")
	require.Equal(t, exitUsage, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "flag provided but not defined: -nope")
	require.Contains(t, r.stderr, usage)
	r = idemctl(t, "", "inspect", "--nope")
	require.Equal(t, exitUsage, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "usage: idemctl [--db URL] inspect --scope S --key K")
}

func TestUsage_DocCommentRepeatsHelpText(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	require.NotNil(t, f.Doc)
	var want strings.Builder
	for line := range strings.Lines(usage) {
		if line == "\n" {
			want.WriteString(line)
		} else {
			want.WriteString("\t" + line)
		}
	}
	require.Contains(t, f.Doc.Text(), want.String(), "doc.go must carry the usage text; regenerate it from usage.go")
}

func TestHumanBytes_UsesIECUnitsAndSaysUnknownForMinusOne(t *testing.T) {
	t.Parallel()
	require.Equal(t, "unknown", humanBytes(-1))
	require.Equal(t, "0 B", humanBytes(0))
	require.Equal(t, "1023 B", humanBytes(1023))
	require.Equal(t, "16.0 KiB (16384 bytes)", humanBytes(16384))
	require.Equal(t, "1.5 MiB (1572864 bytes)", humanBytes(1572864))
}

func TestSQLite_MigrateStatsInspectReleasePurge(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "orders.db")
	dbURL := "sqlite://" + path

	r := idemctl(t, "", "--db", dbURL, "migrate")
	require.Equal(t, exitOK, r.code)
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	s := sqlite.NewStore(db)
	claim(t, s, "stuck", time.Hour)
	final(t, s, "done", idempotency.StatusDone, time.Hour)
	final(t, s, "expired", idempotency.StatusDone, time.Microsecond)
	time.Sleep(20 * time.Millisecond)

	r = idemctl(t, "", "--db", dbURL, "stats", "--json")
	require.Equal(t, exitOK, r.code)
	var st statsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, map[idempotency.Status]int64{"PROCESSING": 1, "DONE": 2, "FAILED": 0}, st.ByStatus)
	require.EqualValues(t, 1, st.AwaitingPurge)
	require.NotNil(t, st.TableBytes)

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "done")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "response:       201 Created")

	r = idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck", "--yes")
	require.Equal(t, exitOK, r.code)
	requireGone(t, s, "stuck")

	r = idemctl(t, "", "--db", dbURL, "purge")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "purged 1 final records past their retention\n", r.stdout)
}
