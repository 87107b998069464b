package brokertest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Server is a broker of a test's own, on loopback ports of its own, that
// the test may stop and start again: the machine's brokers are shared and
// never restarted.
type Server struct {
	t           testing.TB
	URL         string
	stop, start func()
}

// Stop stops the broker: every connection is closed, and new ones are
// refused until Start. Its durable state is kept.
func (s *Server) Stop() {
	s.t.Helper()
	s.stop()
}

// Start starts a stopped broker again on the same port with the same data
// and returns once it listens.
func (s *Server) Start() {
	s.t.Helper()
	s.start()
}

// StartNATS starts nats-server with JetStream, its store in a directory of
// the test's. It is skipped (or fails, when required) without nats-server.
func StartNATS(t testing.TB) *Server {
	t.Helper()
	bin := lookPath(t, "nats-server", "/usr/sbin/nats-server")
	port := freePort(t)
	dir := t.TempDir()
	logFile := filepath.Join(dir, "nats.log")
	args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "store"), "-l", logFile}
	var cmd *exec.Cmd
	var exited chan struct{}
	start := func() {
		cmd = exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start nats-server: %v", err)
		}
		exited = make(chan struct{})
		go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(cmd, exited)
		if err := awaitListening(port, 30*time.Second, exited); err != nil {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("%v; its log:\n%s", err, b)
		}
	}
	stopped := true
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
		}
	}
	startStopped := func() { start(); stopped = false }
	startStopped()
	t.Cleanup(stop)
	return &Server{t: t, URL: "nats://127.0.0.1:" + strconv.Itoa(port), stop: stop, start: startStopped}
}

// StartRabbitMQ starts a RabbitMQ node of the test's own (its own node
// name, ports, database and Erlang cookie), which takes several seconds.
// Stop and Start stop and start the broker application inside the node
// (rabbitmqctl stop_app, start_app): every connection is closed, and every
// queue recovers from disk when it starts, as in a restart of the broker.
// It is skipped (or fails, when required) without RabbitMQ's scripts.
//
// A node whose boot fails (it exits, or its listener closes again before
// the application has started: a port another process took meanwhile, a
// boot step that timed out on a busy machine) is started again on other
// ports, up to three times; the failed boot's log is in the test's log.
func StartRabbitMQ(t testing.TB) *Server {
	t.Helper()
	// Debian's own scripts, not the wrappers in /usr/sbin, which run them
	// as the rabbitmq user: that user cannot write to the test's directory.
	server := lookPath(t, "/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")
	ctl := lookPath(t, filepath.Join(filepath.Dir(server), "rabbitmqctl"), "rabbitmqctl")
	const boots = 3
	for boot := 1; ; boot++ {
		s, err := bootRabbitMQ(t, server, ctl)
		if err == nil {
			return s
		}
		if boot == boots {
			t.Fatalf("RabbitMQ did not boot in %d tries; the last: %v", boots, err)
		}
		t.Logf("RabbitMQ did not boot (try %d of %d), starting it again on other ports: %v", boot, boots, err)
	}
}

// bootRabbitMQ starts one node and returns once its application has
// started and its AMQP port listens.
func bootRabbitMQ(t testing.TB, server, ctl string) (*Server, error) {
	port, dist := freePort(t), freePort(t)
	for dist == port {
		dist = freePort(t)
	}
	dir := t.TempDir()
	node := "idemtest" + strconv.Itoa(port) + "@localhost"
	env := append(os.Environ(),
		"HOME="+dir, // the node's own Erlang cookie
		"RABBITMQ_NODENAME="+node, "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port), "RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	for name, text := range map[string]string{"plugins": "[].\n", "rabbitmq-env.conf": "", "rabbitmq.conf": "loopback_users = none\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	logFile := filepath.Join(dir, "server.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(server)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rabbitmq-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	rabbitmqctl := func(args ...string) error {
		c := exec.Command(ctl, append([]string{"-n", node}, args...)...)
		c.Env = env
		if b, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl %v: %w\n%s", args, err, b)
		}
		return nil
	}
	shutdown := func() {
		if rabbitmqctl("stop") != nil {
			_ = cmd.Process.Kill()
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
		out.Close()
	}
	booted := func() error {
		if err := awaitListening(port, 120*time.Second, exited); err != nil {
			return err
		}
		if err := rabbitmqctl("await_startup", "-t", "120"); err != nil {
			return err
		}
		return awaitListening(port, time.Second, exited) // still: the boot did not fail after the listener opened
	}
	if err := booted(); err != nil {
		shutdown()
		b, _ := os.ReadFile(logFile)
		return nil, fmt.Errorf("%w; the node's log:\n%s", err, b)
	}
	t.Cleanup(shutdown)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	return &Server{t: t, URL: "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(port) + "/",
		stop: func() { must(rabbitmqctl("stop_app")) },
		start: func() {
			must(rabbitmqctl("start_app"))
			must(awaitListening(port, 120*time.Second, exited))
		}}, nil
}

// lookPath finds the first of names that exists (a path) or is in PATH.
func lookPath(t testing.TB, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if Required() {
		t.Fatalf("%s is not installed; CI requires it", names[0])
	}
	t.Skipf("%s is not installed", names[0])
	return ""
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// awaitListening waits until port accepts connections; it fails when it
// does not within the time or the server exits.
func awaitListening(port int, within time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-exited:
			return fmt.Errorf("the broker exited before it listened on %d", port)
		default:
		}
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the broker did not listen on %d within %v", port, within)
		}
		time.Sleep(50 * time.Millisecond) // polling a server's start, not an interleaving
	}
}
