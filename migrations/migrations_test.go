package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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
