package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Step is one statement of a migration script with the guard that decides
// whether it runs.
type Step struct {
	// SQL is the statement, without its trailing semicolon.
	SQL string
	// RunIf is the query of the "-- run if:" directive before the statement,
	// or "" when it has none and always runs. The query returns one row of
	// one number, and the statement runs only when that number is non-zero:
	// it asks "is this statement's effect still missing?".
	RunIf string
}

// directive starts the comment line that guards the statement after it.
const directive = "-- run if:"

// Steps splits a migration script into statements as Statements does, and
// gives each the "-- run if:" directive on the comment line before it (other
// comment lines and blank lines may stand between them).
//
// A directive that no statement follows, a second directive before the same
// statement, a directive inside a statement, one without a query, and a
// comment that reads like a misspelt directive ("-- run if SELECT …") are
// errors: each would otherwise let a statement run unguarded.
func Steps(script string) ([]Step, error) {
	steps, err := parse(script)
	if err != nil {
		return nil, err
	}
	return steps, nil
}

// Statements splits a migration file into statements: comment lines are
// dropped and a statement ends at a line ending with a semicolon. The files
// are ours, so this needs no general SQL lexer.
//
// "-- run if:" directives are comment lines too, so they are dropped and
// their statements returned as if unguarded; Apply uses Steps instead.
func Statements(script string) []string {
	steps, _ := parse(script)
	var out []string
	for _, s := range steps {
		out = append(out, s.SQL)
	}
	return out
}

// parse splits script into steps. It reads to the end whatever it meets, so
// that Statements keeps splitting as it always has, and reports the first
// misplaced directive for Steps.
func parse(script string) ([]Step, error) {
	var (
		steps   []Step
		cur     strings.Builder
		guard   string
		guardAt int // line of guard, 0 when there is none
		problem error
	)
	fail := func(line int, format string, args ...any) {
		if problem == nil {
			problem = fmt.Errorf("line %d: %s", line, fmt.Sprintf(format, args...))
		}
	}
	n := 0
	for line := range strings.Lines(script) {
		n++
		trimmed := strings.TrimSpace(line)
		if query, ok, err := cutDirective(trimmed); ok || err != nil {
			switch {
			case err != nil:
				fail(n, "%v", err)
			case cur.Len() > 0:
				fail(n, "%q inside a statement; put it before the statement's first line", directive)
			case guardAt != 0:
				fail(n, "a second %q before one statement (the first is on line %d); join the conditions with AND", directive, guardAt)
			default:
				guard, guardAt = query, n
			}
			continue
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			steps = append(steps, Step{SQL: strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"), RunIf: guard})
			cur.Reset()
			guard, guardAt = "", 0
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		steps = append(steps, Step{SQL: s, RunIf: guard})
		guard, guardAt = "", 0
	}
	if guardAt != 0 {
		fail(guardAt, "%q with no statement after it", directive)
	}
	return steps, problem
}

// cutDirective reports whether the trimmed line is a "-- run if:" directive
// and returns its query. A comment that starts with "run if" in another form
// is an error rather than a comment, as is a directive without a query.
func cutDirective(trimmed string) (query string, ok bool, err error) {
	text, isComment := strings.CutPrefix(trimmed, "--")
	if !isComment {
		return "", false, nil
	}
	text = strings.TrimSpace(text)
	if !strings.HasPrefix(strings.ToLower(text), "run if") {
		return "", false, nil
	}
	rest, found := strings.CutPrefix(text, "run if:")
	if !found {
		return "", false, fmt.Errorf("%q reads like a guard; write %q followed by the query", trimmed, directive+" SELECT …")
	}
	query = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), ";"))
	if query == "" {
		return "", false, fmt.Errorf("%q without a query", directive)
	}
	return query, true, nil
}

// Run executes the step on conn as Apply does, unless its guard finds the
// effect already there, and reports whether the statement ran.
func (s Step) Run(ctx context.Context, conn *sql.Conn) (bool, error) {
	return s.run(ctx, conn)
}

// run executes the step on conn unless its guard finds the effect already
// there, and reports whether the statement ran.
func (s Step) run(ctx context.Context, conn *sql.Conn) (bool, error) {
	if s.RunIf != "" {
		var missing sql.NullInt64
		if err := conn.QueryRowContext(ctx, s.RunIf).Scan(&missing); err != nil {
			return false, fmt.Errorf("run if: %w", err)
		}
		if !missing.Valid {
			return false, errors.New("run if: the query returned NULL; want a number, non-zero to run the statement")
		}
		if missing.Int64 == 0 {
			return false, nil
		}
	}
	if _, err := conn.ExecContext(ctx, s.SQL); err != nil {
		return false, err
	}
	return true, nil
}
