package migrations_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/migrations"
)

func TestList_EveryDialectHasTheSameVersionsWithUpAndDown(t *testing.T) {
	t.Parallel()
	var names [][]string
	for _, dialect := range []string{"mysql", "sqlite"} {
		list, err := migrations.List(dialect)
		require.NoError(t, err)
		var got []string
		for i, m := range list {
			require.Equal(t, i+1, m.Version, "%s: versions are consecutive from 1", dialect)
			require.NotEmpty(t, m.Up, "%s %d: up", dialect, m.Version)
			require.NotEmpty(t, m.Down, "%s %d: down", dialect, m.Version)
			got = append(got, m.Name)
		}
		names = append(names, got)
	}
	require.Equal(t, names[0], names[1], "dialects migrate through the same steps")
}

func TestList_UnknownDialect_IsAnError(t *testing.T) {
	t.Parallel()
	_, err := migrations.List("oracle")
	require.ErrorContains(t, err, `unknown dialect "oracle"`)
}

func TestStatements_SplitsOnTrailingSemicolonsAndDropsComments(t *testing.T) {
	t.Parallel()
	got := migrations.Statements(`-- a comment
CREATE TABLE a (
  x INT -- trailing comments stay inside the statement
);

CREATE INDEX i ON a (x);
SELECT 1`)
	require.Equal(t, []string{
		"CREATE TABLE a (\n  x INT -- trailing comments stay inside the statement\n)",
		"CREATE INDEX i ON a (x)",
		"SELECT 1",
	}, got)
}

func TestStatements_DropsRunIfDirectivesLikeOtherComments(t *testing.T) {
	t.Parallel()
	got := migrations.Statements(`-- run if: SELECT 1
ALTER TABLE a DROP INDEX i;
ALTER TABLE a ADD INDEX j (x);`)
	require.Equal(t, []string{"ALTER TABLE a DROP INDEX i", "ALTER TABLE a ADD INDEX j (x)"}, got)
}

func TestSteps_GuardsOnlyTheStatementAfterARunIfDirective(t *testing.T) {
	t.Parallel()
	got, err := migrations.Steps(`-- The first index goes.
-- run if: SELECT COUNT(*) > 0 FROM t WHERE name = 'i'
-- Other comments and blank lines may stand between.

ALTER TABLE a
  DROP INDEX i;
ALTER TABLE a ADD INDEX j (x);
--run if:SELECT 2;
ALTER TABLE a ADD INDEX k (y)`)
	require.NoError(t, err)
	require.Equal(t, []migrations.Step{
		{SQL: "ALTER TABLE a\n  DROP INDEX i", RunIf: "SELECT COUNT(*) > 0 FROM t WHERE name = 'i'"},
		{SQL: "ALTER TABLE a ADD INDEX j (x)"},
		{SQL: "ALTER TABLE a ADD INDEX k (y)", RunIf: "SELECT 2"},
	}, got)
}

func TestSteps_MisplacedOrMisspeltRunIfDirective_IsAnError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, script, want string
	}{
		{
			name:   "no statement after it",
			script: "SELECT 1;\n-- run if: SELECT 1\n",
			want:   `line 2: "-- run if:" with no statement after it`,
		},
		{
			name:   "two before one statement",
			script: "-- run if: SELECT 1\n-- run if: SELECT 2\nSELECT 3;",
			want:   `line 2: a second "-- run if:" before one statement (the first is on line 1)`,
		},
		{
			name:   "inside a statement",
			script: "ALTER TABLE a\n-- run if: SELECT 1\n  DROP INDEX i;",
			want:   `line 2: "-- run if:" inside a statement`,
		},
		{
			name:   "without a query",
			script: "-- run if:\nSELECT 1;",
			want:   `line 1: "-- run if:" without a query`,
		},
		{
			name:   "without the colon",
			script: "-- run if SELECT 1\nSELECT 1;",
			want:   `line 1: "-- run if SELECT 1" reads like a guard`,
		},
		{
			name:   "in capitals",
			script: "-- RUN IF: SELECT 1\nSELECT 1;",
			want:   `line 1: "-- RUN IF: SELECT 1" reads like a guard`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := migrations.Steps(tc.script)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// idempotentByItself matches the statements that need no guard.
var idempotentByItself = regexp.MustCompile(`^(CREATE TABLE IF NOT EXISTS|DROP TABLE IF EXISTS|CREATE (UNIQUE )?INDEX IF NOT EXISTS|DROP INDEX IF EXISTS) `)

// alterClause matches the start of each change in an ALTER TABLE statement.
var alterClause = regexp.MustCompile(`(?i)\b(ADD|DROP|MODIFY|CHANGE|RENAME|ALTER COLUMN)\b`)

func TestMigrations_EveryStatementIsIdempotentOrGuarded(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		list, err := migrations.List(dialect)
		require.NoError(t, err)
		for _, m := range list {
			for direction, script := range map[string]string{"up": m.Up, "down": m.Down} {
				file := fmt.Sprintf("%s/%03d_%s.%s.sql", dialect, m.Version, m.Name, direction)
				steps, err := migrations.Steps(script)
				require.NoError(t, err, file)
				for i, s := range steps {
					if s.RunIf == "" {
						require.Regexp(t, idempotentByItself, s.SQL,
							"%s statement %d: make it idempotent (IF [NOT] EXISTS) or give it a -- run if: guard", file, i+1)
					}
					// A guard can tell only whether one change is still
					// missing, so a guarded ALTER makes one change.
					if strings.HasPrefix(s.SQL, "ALTER TABLE") {
						require.Len(t, alterClause.FindAllString(s.SQL, -1), 1,
							"%s statement %d: one change per ALTER TABLE, each with its own guard", file, i+1)
					}
				}
			}
		}
	}
}

func TestStep_RunsOnlyWhenItsGuardReturnsNonZero(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MySQL(t)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })

	for i, tc := range []struct {
		name    string
		runIf   string
		wantRan bool
		wantErr string
	}{
		{name: "no guard", wantRan: true},
		{name: "zero", runIf: "SELECT 0"},
		{name: "one", runIf: "SELECT 1", wantRan: true},
		{name: "a count above one", runIf: "SELECT 2", wantRan: true},
		{name: "NULL", runIf: "SELECT NULL", wantErr: "run if: the query returned NULL"},
		{name: "no row", runIf: "SELECT 1 FROM DUAL WHERE 0", wantErr: "run if: sql: no rows in result set"},
		{name: "a failing query", runIf: "SELECT nope", wantErr: "run if: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := fmt.Sprintf("guarded_%d", i)
			ran, err := migrations.Step{SQL: "CREATE TABLE " + table + " (x INTEGER)", RunIf: tc.runIf}.Run(ctx, conn)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantRan, ran)
			var n int
			require.NoError(t, conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table).Scan(&n))
			require.Equal(t, tc.wantRan, n == 1, "the statement ran")
		})
	}
}
