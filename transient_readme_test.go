package idempotency

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeTransientTable reads the README's "Which database errors are
// transient" table: per row, its server, codes and verdict.
func readmeTransientTable(t *testing.T) (rows [][3]string) {
	t.Helper()
	raw, err := os.ReadFile("docs/http.md")
	require.NoError(t, err)
	_, after, found := strings.Cut(string(raw), "**Which database errors are transient.**")
	require.True(t, found, "the README has the table")
	inTable := false
	for _, line := range strings.Split(after, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if !inTable || strings.HasPrefix(cells[0], "---") {
			inTable = true // the header row, then the separator
			continue
		}
		require.Len(t, cells, 4, "row %q", line)
		rows = append(rows, [3]string{cells[0], cells[1], cells[2]})
	}
	require.NotEmpty(t, rows)
	return rows
}

// The README's table and the code's are one table: every code the code
// classifies is in the README with the same verdict, and every code the
// README lists is classified so in the code.
func TestTransientTable_TheREADMEListsEveryCodeWithTheCodesVerdict(t *testing.T) {
	t.Parallel()
	verdict := func(row serverError) string {
		switch {
		case row.transient && row.lost:
			return "yes, session lost"
		case row.transient:
			return "yes"
		}
		return "no"
	}
	inREADME := map[string]string{} // "mysql 1205" or "sqlstate 40" -> verdict
	for _, row := range readmeTransientTable(t) {
		kind := "mysql"
		if row[0] == "PostgreSQL" {
			kind = "sqlstate"
		}
		for _, code := range strings.Split(row[1], ", ") {
			if code == "any other" {
				continue
			}
			code = strings.TrimPrefix(code, "class ")
			_, dup := inREADME[kind+" "+code]
			require.False(t, dup, "%s %s is listed twice", kind, code)
			inREADME[kind+" "+code] = row[2]
		}
	}
	inCode := map[string]string{}
	for n, row := range mysqlErrors {
		inCode[fmt.Sprintf("mysql %d", n)] = verdict(row)
	}
	for code, row := range sqlStates {
		inCode["sqlstate "+code] = verdict(row)
	}
	require.Equal(t, inCode, inREADME, "transient.go's tables and the README's must say the same")
}
