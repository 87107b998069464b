package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
)

// Round trips to PostgreSQL per request, as pgx sends them (a statement,
// BEGIN, COMMIT and ROLLBACK are one each; a pipelined batch is one), once
// the statements are prepared. The bare create is BEGIN, the handler's
// INSERT, COMMIT: 3. A path that gains a round trip fails here. MariaDB's
// counts are specified in the root package (roundtrips_internal_test.go).
//
//	path                                   single-phase   claim-first
//	new key (OpenDB)                       3              5
//	new key (pgx's stdlib.OpenDB)          4              5
//	new key, route reading first (hint)    +1 SELECT      —
//	replay, replay cache on                0              0
//	replay, cache off, route reading       1 SELECT       2 (INSERT, SELECT)
//	replay, cache off, route not reading   5              2
//
// Claim-first's finish is its own round trip here: on PostgreSQL its fence
// (an UPDATE that matched no row) cannot stop a COMMIT pipelined behind it
// without a statement that fails on purpose.
func TestRoundTrips_PostgreSQL_PerRequest_ModeAndPath(t *testing.T) {
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
		open  func(pgx.ConnConfig, ...stdlib.OptionOpenDB) *sql.DB
		mode  idempotency.Mode
		paths []path
	}{
		{"OpenDB/single-phase", postgres.OpenDB, idempotency.ModeSinglePhase, []path{
			{"new key", false, true, false, 3},
			{"new key, reading first", true, true, false, 4},
			{"replay, cache on", false, true, true, 0},
			{"replay, cache off, reading first", true, false, true, 1},
			{"replay, cache off, not reading", false, false, true, 5},
		}},
		{"OpenDB/claim-first", postgres.OpenDB, idempotency.ModeClaimFirst, []path{
			{"new key", false, true, false, 5},
			{"replay, cache on", false, true, true, 0},
			{"replay, cache off", false, false, true, 2},
		}},
		{"stdlib.OpenDB/single-phase", stdlib.OpenDB, idempotency.ModeSinglePhase, []path{
			{"new key", false, true, false, 4},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, tr := tracedPool(t, tc.open)
			store := postgres.NewStore(db)
			ctx := context.Background()
			run := func(ctx context.Context) idempotency.Result {
				tx, _ := idempotency.TxFromContext(ctx)
				_, key, _ := idempotency.KeyFromContext(ctx)
				if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (idem_key) VALUES ($1)", key); err != nil {
					return idempotency.Result{Status: http.StatusInternalServerError, Body: []byte(err.Error())}
				}
				return idempotency.Result{Status: http.StatusCreated, Body: []byte(`{"ok":true}`)}
			}
			bare := func(key string) []string {
				tr.take()
				tx, err := db.Begin()
				require.NoError(t, err)
				_, err = tx.Exec("INSERT INTO ledger (idem_key) VALUES ($1)", key)
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
				log, _ := tr.take()
				return log
			}
			bare("warm-up")
			require.Len(t, bare("bare"), 3, "the bare create")

			for i, p := range tc.paths {
				t.Run(p.name, func(t *testing.T) {
					cfg := &idempotency.Config{Mode: tc.mode}
					if !p.cache {
						cfg.ReplayCacheBytes = -1
					}
					mw, err := idempotency.New(store, cfg)
					require.NoError(t, err)
					do := func(key string) idempotency.Answer {
						return mw.Do(ctx, idempotency.Action{Scope: "s", Key: key, Fingerprint: "fp"}, run)
					}
					if !p.reads && tc.mode == idempotency.ModeSinglePhase {
						// A new process reads first for its first window
						// of requests; a window of new keys stops it.
						for j := range 256 {
							require.Equal(t, http.StatusCreated, do(fmt.Sprint("window-", i, "-", j)).Status)
						}
					}
					// The path once to prepare its statements, then counted.
					for _, key := range []string{fmt.Sprint("prepare-", i), fmt.Sprint("path-", i)} {
						if p.retry {
							require.Equal(t, http.StatusCreated, do(key).Status)
						}
						tr.take()
						a := do(key)
						log, prepares := tr.take()
						require.Equal(t, http.StatusCreated, a.Status, "%+v", a.Problem)
						require.Equal(t, p.retry, a.Replayed)
						if strings.HasPrefix(key, "path-") {
							require.Zero(t, prepares)
							require.Len(t, log, p.want, "round trips: %q", log)
						}
					}
				})
			}
		})
	}
}
