package main

// The operator CLI in the documents' console blocks, as readme_test.go runs
// it: `go run ./cmd/idemctl ARGS [| grep PATTERN]` runs the built idemctl
// with ARGS in the run's working directory, its --db the run's database
// for the document's URL (as for the server), and prints what it prints;
// its exit status is the command's.

import (
	"strings"

	"github.com/stretchr/testify/require"
)

// idemctl runs the CLI and returns its standard output.
func (r *readmeRun) idemctl(c consoleCommand, args []string) string {
	t := r.t
	t.Helper()
	full := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		name, value, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if name != "db" {
			full = append(full, args[i])
			continue
		}
		if !inline {
			require.Less(t, i+1, len(args), "%s line %d: %s needs a value", c.file, c.line, args[i])
			value = args[i+1]
			i++
		}
		full = append(full, "--db", r.database(value))
	}
	return r.foreground(c, idemctlBinary, full)
}
