package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// idemctl --db postgres://… on a fresh schema of its own (search_path in
// the URL), as an operator would run it.
func TestPostgres_MigrateStatsInspectReleasePurge(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.Postgres(t)

	for range 2 {
		r := idemctl(t, "", "--db", dbURL, "migrate")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stdout, "schema at version 005_payments")
		require.Contains(t, r.stdout, "migrated PostgreSQL at 127.0.0.1:5432, database test, schema idem_test_")
	}
	s := postgres.NewStore(db)
	claim(t, s, "stuck", time.Hour)
	claim(t, s, "dead", time.Microsecond)
	final(t, s, "done", idempotency.StatusDone, time.Hour)
	final(t, s, "expired", idempotency.StatusDone, time.Microsecond)
	time.Sleep(20 * time.Millisecond)

	r := idemctl(t, "", "--db", dbURL, "stats", "--json")
	require.Equal(t, exitOK, r.code)
	var st statsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, map[idempotency.Status]int64{"PROCESSING": 2, "DONE": 2, "FAILED": 0}, st.ByStatus)
	require.EqualValues(t, 1, st.ExpiredLeases)
	require.EqualValues(t, 1, st.AwaitingPurge)
	require.NotNil(t, st.TableBytes)
	require.Positive(t, *st.TableBytes)

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "done")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "response:       201 Created")

	r = idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "stuck", "--yes")
	require.Equal(t, exitOK, r.code)
	requireGone(t, s, "stuck")

	r = idemctl(t, "", "--db", dbURL, "release", "--scope", "tenant-1", "--key", "done", "--yes")
	require.Equal(t, exitRefused, r.code, "a DONE record is never released")
	requireRecord(t, s, "done", idempotency.StatusDone, 2)

	r = idemctl(t, "", "--db", dbURL, "purge")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "purged 1 final records past their retention\n", r.stdout)

	r = idemctl(t, "", "--db", dbURL, "inspect", "--scope", "tenant-1", "--key", "expired")
	require.Equal(t, exitNotFound, r.code)
}

func TestPostgres_UnmigratedSchema_FailsWithAHintToMigrate(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.Postgres(t)

	r := idemctl(t, "", "--db", dbURL, "stats")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "run idemctl migrate")
}

func TestPostgres_BadDatabaseURL_ExitsCannotConnectAndSaysWhy(t *testing.T) {
	t.Parallel()
	_, reachable := pgtest.Postgres(t) // skips (or fails in CI) without a server
	noDB := strings.Replace(reachable, "/test?", "/idemctl_no_such_database?", 1)
	require.NotEqual(t, reachable, noDB, "the test DSN names database test")
	for _, tc := range []struct {
		name, url string
		want      []string
	}{
		{"unreachable server", "postgres://postgres:pw@127.0.0.1:1/test?sslmode=disable",
			[]string{"cannot connect to PostgreSQL at 127.0.0.1:1, database test", "check that the server runs", "postgres://USER"}},
		{"malformed URL", "postgres://postgres:pw@127.0.0.1:notaport/test",
			[]string{"malformed PostgreSQL URL", "postgres://USER[:PASSWORD]@HOST:PORT/DBNAME"}},
		{"no such database", noDB, []string{"the database does not exist", "idemctl migrate"}},
		{"postgresql scheme, unreachable", "postgresql://postgres@127.0.0.1:1/test?sslmode=disable", []string{"cannot connect"}},
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
