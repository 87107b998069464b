package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// GoBench is one line of `go test -bench -benchmem` output.
type GoBench struct {
	Name        string  `json:"name"`
	Iterations  string  `json:"iterations"`
	NsPerOp     float64 `json:"ns_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	Line        string  `json:"line"`
}

// repoRoot finds the library's module root: the nearest directory, from the
// working directory upwards, whose go.mod declares
// github.com/orderguard/idempotency itself.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if strings.TrimSpace(first) == "module github.com/orderguard/idempotency" {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/orderguard/idempotency above the working directory")
		}
		dir = parent
	}
}

// runGoBench runs the root package's Go benchmarks with -benchmem and returns
// the benchmark lines and the exact command. The side-by-side benchmarks
// (SideBySide: seconds of load per iteration, ratios of their own; see
// docs/performance.md) are a measurement of their own, not this family's.
func runGoBench(ctx context.Context, benchtime, mysqlDSN string) ([]GoBench, string, string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, "", "", err
	}
	args := []string{"test", "-run=^$", "-bench=.", "-skip=SideBySide", "-benchmem"}
	if benchtime != "" {
		args = append(args, "-benchtime="+benchtime)
	}
	args = append(args, ".")
	cmdline := "go " + strings.Join(args, " ")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IDEMPOTENCY_TEST_MYSQL_DSN="+mysqlDSN)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	fmt.Fprintf(os.Stderr, "== Go benchmarks: (cd %s && %s)\n", root, cmdline)
	runErr := cmd.Run()
	var benches []GoBench
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		b := GoBench{Name: fields[0], Iterations: fields[1], Line: line}
		for i := 2; i+1 < len(fields); i += 2 {
			var v float64
			if _, err := fmt.Sscan(fields[i], &v); err != nil {
				continue
			}
			switch fields[i+1] {
			case "ns/op":
				b.NsPerOp = v
			case "B/op":
				b.BytesPerOp = v
			case "allocs/op":
				b.AllocsPerOp = v
			}
		}
		benches = append(benches, b)
		fmt.Fprintln(os.Stderr, "  "+line)
	}
	if runErr != nil {
		return benches, cmdline, out.String(), fmt.Errorf("%s: %w", cmdline, runErr)
	}
	return benches, cmdline, out.String(), nil
}

// goBenchMarkdown writes the Go benchmarks' lines, if they ran.
func (rep *Report) goBenchMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(rep.GoBench) > 0 {
		w("## In-process path: allocations per request\n\n")
		w("`%s` in the repository root (bench_test.go, fingerprint_test.go), run by idembench before the load points. ", rep.GoBenchCmd)
		w("`FakeStore` runs the real middleware over an in-memory idempotency.Store whose transactions come from a do-nothing database/sql driver, with a minimal handler that answers a fixed 201 — a fake used only in these benchmarks, so that they count the middleware's own work; `FakeStore/no-middleware` is the same handler in a plain transaction. ")
		w("`MariaDB` runs the example order service over the real MySQL store and a fresh database from internal/testdb (skipped without a server), through ServeHTTP without a network, so every allocation of middleware, store, driver and handler counts. Each iteration also builds its request from a template (a few allocations, in every variant).\n\n```\n")
		for _, g := range rep.GoBench {
			w("%s\n", g.Line)
		}
		w("```\n\n")
	}
}
