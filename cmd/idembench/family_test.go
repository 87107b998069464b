package main

import (
	"context"
	"os"
	"testing"
)

// testMariaDB opens a MariaDB family on a fresh database of the server
// opts names, closed at the test's end. Without a server the test skips,
// except in CI, where it fails.
func testMariaDB(t *testing.T, opts options, label string) *family {
	t.Helper()
	f, err := openMariaDB(context.Background(), opts.mysql, label, false)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(f.close)
	return f
}

// runFamily runs a family's measurements with opts over f, as main would,
// and fails the test on an error or a correctness failure.
func runFamily(t *testing.T, opts options, f *family, run func(*runner, context.Context, *family) error) *runner {
	t.Helper()
	r := &runner{opts: opts}
	if err := run(r, context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if len(r.failures) > 0 {
		t.Fatalf("failures: %q", r.failures)
	}
	return r
}
