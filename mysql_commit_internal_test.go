package idempotency

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A statement that holds more than one is refused on OpenMySQL's pool; one
// statement is never refused for a ';' in a string, an identifier or a
// comment. Where the server's sql_mode decides how a quote ends (backslash
// escapes), the statement is refused if either reading holds several.
func TestRefuseMultiStatements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		q      string
		refuse bool
	}{
		{"SELECT 1", false},
		{"SELECT 1;", false},
		{"SELECT 1; ", false},
		{"SELECT 1; -- done", false},
		{"SELECT 1; # done", false},
		{"SELECT 1; /* done */", false},
		{"INSERT INTO t VALUES ('a;b')", false},
		{`INSERT INTO t VALUES ("a;b")`, false},
		{"SELECT `a;b` FROM t", false},
		{"INSERT INTO t VALUES ('it''s; fine')", false},
		{"SELECT 1 -- ; DROP TABLE t\n", false},
		{"SELECT 1 /* ; DROP TABLE t */", false},
		{"SELECT 1; SELECT 2", true},
		{"SELECT 1;SELECT 2", true},
		{"SELECT 1; 'x'", true},
		{"SELECT 1; /*!50000 DROP TABLE t */", true},
		{"SELECT 1 /*! ; DROP TABLE t */", true},
		{"SELECT 1;--x", true}, // "--" without a space is not a comment
		{`INSERT INTO t VALUES ('\'); DROP TABLE t; -- ')`, true},
		{`INSERT INTO t VALUES ('\\'); DROP TABLE t`, true},
		{"BEGIN NOT ATOMIC SELECT 1; SELECT 2; END", true},
	} {
		require.Equal(t, tc.refuse, refuseMultiStatements(tc.q) != nil, "%q", tc.q)
	}
}
