package main

// What readme_test.go does alike for every program of the documents other
// than the server: build it once, run it in the foreground for what it
// prints and its exit status, or start it in the background and wait for
// the log line that says it is ready.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"
)

// programBinary returns a builder of the program in dir (relative to the
// repository's root), built once per test binary run beside the server's
// binary (whose directory is removed at the end).
func programBinary(name, dir string) func() (string, error) {
	return sync.OnceValues(func() (string, error) {
		server, err := crashServerBinary()
		if err != nil {
			return "", err
		}
		bin := filepath.Join(filepath.Dir(server), name)
		cmd := exec.Command(goTool(), "build", "-o", bin, ".")
		cmd.Dir = filepath.Join(repoRoot, dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", name, err, out)
		}
		return bin, nil
	})
}

var (
	orderConsumerBinary = programBinary("orderconsumer", "examples/orderconsumer")
	grpcServerBinary    = programBinary("grpcserver", "examples/grpcserver")
	idemctlBinary       = programBinary("idemctl", "cmd/idemctl")
)

// foreground runs bin with args in the run's working directory and returns
// its standard output; its exit status becomes the command's (echo $?).
func (r *readmeRun) foreground(c consoleCommand, bin func() (string, error), args []string) string {
	t := r.t
	t.Helper()
	path, err := bin()
	require.NoError(t, err)
	cmd := exec.Command(path, args...)
	cmd.Dir = r.dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r.status = 0
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s line %d", c.file, c.line)
		r.status = exit.Sys().(syscall.WaitStatus).ExitStatus()
		fmt.Fprintf(r.logs, "=== %s line %d: %s exited %d: %s\n", c.file, c.line, filepath.Base(path), r.status, stderr.String())
	}
	return stdout.String()
}

// background starts bin with args in the run's working directory, as the
// run's process key (one started under a key that runs replaces it), and
// waits until its log has the line ready.
func (r *readmeRun) background(c consoleCommand, key string, bin func() (string, error), args []string, ready string) {
	t := r.t
	t.Helper()
	if _, running := r.servers[key]; running {
		r.stop(key)
	}
	path, err := bin()
	require.NoError(t, err)
	name := filepath.Base(path)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	require.NoError(t, err)
	cmd := exec.Command(path, args...)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(r.logs, "=== %s line %d: %s %q (its log: %s)\n", c.file, c.line, name, args, log.Name())
	require.NoError(t, cmd.Start())
	s := &readmeServer{cmd: cmd, done: make(chan struct{})}
	r.servers[key] = s
	go func() {
		s.err = cmd.Wait()
		_ = log.Close()
		fmt.Fprintf(r.logs, "=== %s ended: %v\n", name, s.err)
		close(s.done)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("%s's log:\n%s", name, out)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("%s line %d: %s exited before it logged %s: %v\n%s", c.file, c.line, name, ready, s.err, out)
		default:
		}
		if out, _ := os.ReadFile(log.Name()); strings.Contains(string(out), ready) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s line %d: %s did not log %s within 60s", c.file, c.line, name, ready)
}
