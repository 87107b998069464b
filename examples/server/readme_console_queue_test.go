package main

// The queue consumer in the documents' console blocks, as readme_test.go
// runs it:
//   - `go run ./examples/orderconsumer ARGS &` starts the built consumer
//     with ARGS in the run's working directory and waits for its
//     "consuming" log line;
//   - `go run ./examples/orderconsumer publish ARGS` runs the publisher
//     and prints what it prints.
//
// What differs from the document, explicitly and narrowly: -broker is the
// test's NATS (brokertest.NATS; RabbitMQ is not run here), and the stream
// and subject are the run's own (brokertest.Name), given to both, so that
// runs sharing one NATS never consume each other's messages; -db is mapped
// as for the server.

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

	"github.com/orderguard/idempotency/internal/brokertest"
)

// consumerArgs maps a document's orderconsumer arguments to the run's.
func (r *readmeRun) consumerArgs(c consoleCommand, args []string) []string {
	t := r.t
	t.Helper()
	if r.queue.stream == "" {
		r.queue.broker = brokertest.NATS(t)
		r.queue.stream = brokertest.Name("README")
		r.queue.subject = strings.ToLower(r.queue.stream) + ".create"
	}
	out := []string{"-broker", r.queue.broker, "-stream", r.queue.stream, "-subject", r.queue.subject}
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		switch name {
		case "broker", "db", "stream", "subject":
			require.Less(t, i+1, len(args), "%s line %d: %s needs a value", c.file, c.line, args[i])
			value := args[i+1]
			i++
			switch name {
			case "broker":
				require.True(t, strings.HasPrefix(value, "nats://"),
					"%s line %d: readme_test.go runs the consumer on NATS only, not %q", c.file, c.line, value)
			case "db":
				out = append(out, "-db", r.database(value))
			}
		default:
			out = append(out, args[i])
		}
	}
	if !containsFlag(out, "db") {
		out = append(out, "-db", r.database(""))
	}
	return out
}

func containsFlag(args []string, name string) bool {
	for _, a := range args {
		if strings.TrimLeft(a, "-") == name {
			return true
		}
	}
	return false
}

// startConsumer starts the consumer in the background and waits until it
// consumes.
func (r *readmeRun) startConsumer(c consoleCommand, args []string) {
	t := r.t
	t.Helper()
	full := r.consumerArgs(c, args)
	const key = "orderconsumer"
	if _, running := r.servers[key]; running {
		r.stop(key)
	}
	bin, err := orderConsumerBinary()
	require.NoError(t, err)
	log, err := os.Create(filepath.Join(t.TempDir(), "consumer.log"))
	require.NoError(t, err)
	cmd := exec.Command(bin, full...)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(r.logs, "=== %s line %d: consumer %q (its log: %s)\n", c.file, c.line, full, log.Name())
	require.NoError(t, cmd.Start())
	s := &readmeServer{cmd: cmd, done: make(chan struct{})}
	r.servers[key] = s
	go func() {
		s.err = cmd.Wait()
		_ = log.Close()
		fmt.Fprintf(r.logs, "=== consumer ended: %v\n", s.err)
		close(s.done)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("consumer's log:\n%s", out)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("%s line %d: the consumer exited before it consumed: %v\n%s", c.file, c.line, s.err, out)
		default:
		}
		if out, _ := os.ReadFile(log.Name()); strings.Contains(string(out), "msg=consuming") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s line %d: the consumer did not log msg=consuming within 60s", c.file, c.line)
}

// publish runs the publisher and returns what it prints; its exit status
// is the command's.
func (r *readmeRun) publish(c consoleCommand, args []string) string {
	t := r.t
	t.Helper()
	full := r.consumerArgs(c, args)
	for i, a := range full { // the publisher takes no -db
		if a == "-db" {
			full = append(full[:i:i], full[i+2:]...)
			break
		}
	}
	bin, err := orderConsumerBinary()
	require.NoError(t, err)
	cmd := exec.Command(bin, append([]string{"publish"}, full...)...)
	cmd.Dir = r.dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r.status = 0
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s line %d", c.file, c.line)
		r.status = exit.Sys().(syscall.WaitStatus).ExitStatus()
		fmt.Fprintf(r.logs, "=== %s line %d: publish exited %d: %s\n", c.file, c.line, r.status, stderr.String())
	}
	// As for curl: a body without a line break (problem+json) has one on
	// the terminal, before the next prompt.
	out := stdout.String()
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// orderConsumerBinary builds examples/orderconsumer once per test binary
// run.
var orderConsumerBinary = sync.OnceValues(func() (string, error) {
	server, err := crashServerBinary() // its directory is removed at the end
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(server), "orderconsumer")
	cmd := exec.Command(goTool(), "build", "-o", bin, ".")
	cmd.Dir = "../orderconsumer"
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build orderconsumer: %v\n%s", err, out)
	}
	return bin, nil
})
