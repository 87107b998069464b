// Package testbin builds the command a test runs as a process of its own
// (kill -9 specs of the example programs): once per test process, whatever
// how many tests ask.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]*build{}
)

type build struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// Command builds the package in the test's working directory (the command
// under test) the first time it is asked for, and returns the binary's
// path, named name. The binary lives in a temporary directory of its own
// for the rest of the process.
func Command(t testing.TB, name string) string {
	t.Helper()
	mu.Lock()
	b, ok := built[name]
	if !ok {
		b = &build{}
		built[name] = b
	}
	mu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", name+"-test-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		b.out, b.err = exec.Command("go", "build", "-o", b.path, ".").CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("testbin: go build %s: %v\n%s", name, b.err, b.out)
	}
	return b.path
}
