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
