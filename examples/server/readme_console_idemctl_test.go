package main

// The operator CLI in the documents' console blocks, as readme_test.go runs
// it: `go run ./cmd/idemctl ARGS [| grep PATTERN]` runs the built idemctl
// with ARGS in the run's working directory, its --db the run's database
// for the document's URL (as for the server), and prints what it prints;
// its exit status is the command's.

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

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
	bin, err := idemctlBinary()
	require.NoError(t, err)
	cmd := exec.Command(bin, full...)
	cmd.Dir = r.dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r.status = 0
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s line %d", c.file, c.line)
		r.status = exit.Sys().(syscall.WaitStatus).ExitStatus()
		fmt.Fprintf(r.logs, "=== %s line %d: idemctl exited %d: %s\n", c.file, c.line, r.status, stderr.String())
	}
	return stdout.String()
}

// idemctlBinary builds cmd/idemctl once per test binary run.
var idemctlBinary = sync.OnceValues(func() (string, error) {
	server, err := crashServerBinary() // its directory is removed at the end
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(server), "idemctl")
	cmd := exec.Command(goTool(), "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(repoRoot, "cmd", "idemctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build idemctl: %v\n%s", err, out)
	}
	return bin, nil
})
