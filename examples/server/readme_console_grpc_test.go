package main

// The gRPC server in the documents' console blocks, as readme_test.go runs
// it:
//   - `go run ./examples/grpcserver ARGS &` starts the built gRPC server
//     with ARGS in the run's working directory and waits for its
//     "listening" log line;
//   - `go run ./examples/grpcserver call ARGS` runs its client and prints
//     what it prints; its exit status is the command's.
//
// What differs from the document, explicitly and narrowly: -addr (9090 by
// default) is a free port of the test's, the same each time the document
// names that port; -db is mapped as for the server.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"
)

// grpcArgs maps a document's grpcserver arguments to the run's: the
// README port its -addr names, and the rest with -addr and -db replaced.
func (r *readmeRun) grpcArgs(c consoleCommand, args []string, withDB bool) (port string, out []string) {
	t := r.t
	t.Helper()
	port, db := "9090", ""
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		switch name {
		case "addr", "db":
			require.Less(t, i+1, len(args), "%s line %d: %s needs a value", c.file, c.line, args[i])
			if name == "addr" {
				_, p, err := net.SplitHostPort(args[i+1])
				require.NoError(t, err, "%s line %d: -addr", c.file, c.line)
				port = p
			} else {
				db = args[i+1]
			}
			i++
		default:
			out = append(out, args[i])
		}
	}
	out = append([]string{"-addr", r.addr(port)}, out...)
	if withDB {
		out = append([]string{"-db", r.database(db)}, out...)
	}
	return port, out
}

// startGRPC starts the gRPC server in the background and waits until it
// listens.
func (r *readmeRun) startGRPC(c consoleCommand, args []string) {
	t := r.t
	t.Helper()
	port, full := r.grpcArgs(c, args, true)
	key := "grpc:" + port
	if _, running := r.servers[key]; running {
		r.stop(key)
	}
	bin, err := grpcServerBinary()
	require.NoError(t, err)
	log, err := os.Create(filepath.Join(t.TempDir(), "grpcserver.log"))
	require.NoError(t, err)
	cmd := exec.Command(bin, full...)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(r.logs, "=== %s line %d: gRPC server %q (its log: %s)\n", c.file, c.line, full, log.Name())
	require.NoError(t, cmd.Start())
	s := &readmeServer{cmd: cmd, done: make(chan struct{})}
	r.servers[key] = s
	go func() {
		s.err = cmd.Wait()
		_ = log.Close()
		fmt.Fprintf(r.logs, "=== gRPC server ended: %v\n", s.err)
		close(s.done)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("gRPC server's log:\n%s", out)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("%s line %d: the gRPC server exited before it listened: %v\n%s", c.file, c.line, s.err, out)
		default:
		}
		if out, _ := os.ReadFile(log.Name()); strings.Contains(string(out), "msg=listening") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s line %d: the gRPC server did not log msg=listening within 60s", c.file, c.line)
}

// grpcCall runs the gRPC client and returns what it prints.
func (r *readmeRun) grpcCall(c consoleCommand, args []string) string {
	t := r.t
	t.Helper()
	_, full := r.grpcArgs(c, args, false)
	bin, err := grpcServerBinary()
	require.NoError(t, err)
	cmd := exec.Command(bin, append([]string{"call"}, full...)...)
	cmd.Dir = r.dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r.status = 0
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s line %d", c.file, c.line)
		r.status = exit.Sys().(syscall.WaitStatus).ExitStatus()
		fmt.Fprintf(r.logs, "=== %s line %d: call exited %d: %s\n", c.file, c.line, r.status, stderr.String())
	}
	return stdout.String()
}

// grpcServerBinary builds examples/grpcserver once per test binary run.
var grpcServerBinary = sync.OnceValues(func() (string, error) {
	server, err := crashServerBinary() // its directory is removed at the end
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(server), "grpcserver")
	cmd := exec.Command(goTool(), "build", "-o", bin, ".")
	cmd.Dir = "../grpcserver"
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build grpcserver: %v\n%s", err, out)
	}
	return bin, nil
})
