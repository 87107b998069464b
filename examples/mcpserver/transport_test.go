package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/client"
)

// The rules of the tools hold over both transports of the command: stdio
// through the SDK's CommandTransport (what an MCP host does with a
// "command" entry), Streamable HTTP through the SDK's streamable client
// against the -http listener. Each subtest runs its own process against its
// own order API and database.
func TestTransports_ToolRules(t *testing.T) {
	t.Parallel()
	key := client.KeyFor("run-1", "intent-1")
	rules := []struct {
		name string
		run  func(t *testing.T, api *orderAPI, cs *mcp.ClientSession)
	}{
		{"ListTools_AdvertisesTheThreeTools", func(t *testing.T, _ *orderAPI, cs *mcp.ClientSession) {
			var names []string
			for tool, err := range cs.Tools(context.Background(), nil) {
				require.NoError(t, err)
				names = append(names, tool.Name)
			}
			require.Equal(t, []string{"cancel_order", "create_order", "get_order"}, names)
		}},
		{"CreateOrder_CreatesOneOrder", func(t *testing.T, api *orderAPI, cs *mcp.ClientSession) {
			res, out := callTool(t, cs, "create_order", createArgs(key, 2))
			require.False(t, res.IsError, text(res))
			require.NotNil(t, out.Order)
			require.False(t, out.Replayed)
			require.Equal(t, "CREATED", out.Order.Status)
			require.Equal(t, int64(7), out.Order.UserID)
			require.Equal(t, 1, api.orders(t))
		}},
		{"SameKeySameOrder_ReplaysAndCreatesNothing", func(t *testing.T, api *orderAPI, cs *mcp.ClientSession) {
			res, first := callTool(t, cs, "create_order", createArgs(key, 1))
			require.False(t, res.IsError, text(res))
			res, second := callTool(t, cs, "create_order", createArgs(key, 1))
			require.False(t, res.IsError, text(res))
			require.True(t, second.Replayed, "the second call must be a replay")
			require.Equal(t, first.Order.OrderNo, second.Order.OrderNo)
			require.Equal(t, 1, api.orders(t))
		}},
		{"SameKeyDifferentOrder_IsKeyReusedToolError", func(t *testing.T, api *orderAPI, cs *mcp.ClientSession) {
			res, _ := callTool(t, cs, "create_order", createArgs(key, 1))
			require.False(t, res.IsError, text(res))
			res, out := callTool(t, cs, "create_order", createArgs(key, 5))
			require.True(t, res.IsError, "same key, different quantity must fail")
			require.NotNil(t, out.Problem)
			require.Equal(t, client.ProblemKeyReused, out.Problem.Kind)
			require.Equal(t, http.StatusConflict, out.Problem.Status)
			require.Regexp(t, `^key-reused \(HTTP 409\)`, text(res))
			require.Equal(t, 1, api.orders(t))
		}},
		{"NoKey_IsToolErrorAndSendsNothing", func(t *testing.T, api *orderAPI, cs *mcp.ClientSession) {
			res, _ := callTool(t, cs, "create_order", createArgs("", 1))
			require.True(t, res.IsError, "a call without idempotency_key must fail")
			require.Contains(t, text(res), "idempotency_key")
			require.Zero(t, api.requests.Load(), "no request may reach the API without a key")
			require.Zero(t, api.orders(t))
		}},
	}
	for _, tr := range []struct {
		name    string
		connect func(t *testing.T, apiURL string) *mcp.ClientSession
	}{
		{"stdio", connectStdio},
		{"http", connectHTTP},
	} {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			for _, rule := range rules {
				t.Run(rule.name, func(t *testing.T) {
					t.Parallel()
					api := startOrderAPI(t, nil)
					rule.run(t, api, tr.connect(t, api.URL))
				})
			}
		})
	}
}

// SIGTERM and SIGINT are how supervisors and terminals stop a server: both
// end it with exit status 0 and nothing on stderr but the HTTP banner, with
// a session open, and promptly: an HTTP client's open event stream must
// not hold the shutdown until the grace period (26s by default) runs out.
func TestShutdown_SIGTERMOrSIGINT_ExitsZero(t *testing.T) {
	t.Parallel()
	for name, sig := range map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT} {
		t.Run("stdio/"+name, func(t *testing.T) {
			t.Parallel()
			api := startOrderAPI(t, nil)
			// Pipes of our own, so that the process's exit status is ours
			// to collect (CommandTransport would Wait for it itself).
			stdinR, stdinW, err := os.Pipe()
			require.NoError(t, err)
			stdoutR, stdoutW, err := os.Pipe()
			require.NoError(t, err)
			p := startProcess(t, []string{"-api", api.URL}, stdinR, stdoutW)
			require.NoError(t, stdinR.Close())
			require.NoError(t, stdoutW.Close())
			cs := connectSession(t, &mcp.IOTransport{Reader: stdoutR, Writer: stdinW})
			res, out := callTool(t, cs, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 1))
			require.False(t, res.IsError, text(res))
			require.NotNil(t, out.Order)

			require.Equal(t, 0, p.stop(t, sig, 5*time.Second), "exit status after %s; stderr:\n%s", sig, p.stderr.String())
			require.Empty(t, p.stderr.String())
		})
		t.Run("http/"+name, func(t *testing.T) {
			t.Parallel()
			api := startOrderAPI(t, nil)
			p := startProcess(t, []string{"-http", "127.0.0.1:0", "-api", api.URL}, nil, nil)
			cs := connectSession(t, &mcp.StreamableClientTransport{Endpoint: p.endpoint(t)})
			res, out := callTool(t, cs, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 1))
			require.False(t, res.IsError, text(res))
			require.NotNil(t, out.Order)

			require.Equal(t, 0, p.stop(t, sig, 5*time.Second), "exit status after %s; stderr:\n%s", sig, p.stderr.String())
			require.Regexp(t, `^mcpserver: serving MCP over Streamable HTTP at \S+ \(order API \S+\)\n$`, p.stderr.String())
		})
	}
}

// Over HTTP a shutdown lets the call in flight finish and deliver its
// answer, so the agent learns the order exists instead of facing an unknown
// outcome; only then does it close the sessions.
func TestShutdown_HTTPCallInFlight_DeliversItsAnswer(t *testing.T) {
	t.Parallel()
	reached, release := make(chan struct{}), make(chan struct{})
	api := startOrderAPI(t, holdFirstRequest(reached, release))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	transport, served := serveHTTPOnLoopback(time.Minute)(t, ctx, NewServer(api.URL, &client.Client{HTTP: api.HTTP}))
	cs := connectSession(t, transport)
	answered := callInBackground(cs, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 1))
	<-reached
	cancel() // the signal
	requireStillServing(t, served)
	close(release)

	a := <-answered
	require.NoError(t, a.err)
	require.False(t, a.res.IsError, text(a.res))
	require.NoError(t, waitFor(t, served, 5*time.Second))
	require.Equal(t, 1, api.orders(t))
}

// Over stdio a shutdown lets the call in flight finish its request to the
// API (it is not cut halfway) and then returns nil. The SDK writes no
// answer on a closing session, so the agent sees the session end; the same
// call with the same key, in the next session, replays the order created.
func TestShutdown_StdioCallInFlight_FinishesAndRepeatReplays(t *testing.T) {
	t.Parallel()
	reached, release := make(chan struct{}), make(chan struct{})
	api := startOrderAPI(t, holdFirstRequest(reached, release))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	transport, served := serveStdioInMemory(t, ctx, NewServer(api.URL, &client.Client{HTTP: api.HTTP}))
	cs := connectSession(t, transport)
	args := createArgs(client.KeyFor("run-1", "intent-1"), 1)
	answered := callInBackground(cs, "create_order", args)
	<-reached
	cancel() // the signal
	requireStillServing(t, served)
	close(release)

	require.NoError(t, waitFor(t, served, 5*time.Second))
	require.Error(t, (<-answered).err, "no answer is written on a closing stdio session")
	require.Equal(t, 1, api.orders(t), "the call in flight must have finished")

	next, _ := serveStdioInMemory(t, context.Background(), NewServer(api.URL, &client.Client{HTTP: api.HTTP}))
	res, out := callTool(t, connectSession(t, next), "create_order", args)
	require.False(t, res.IsError, text(res))
	require.True(t, out.Replayed)
	require.Equal(t, 1, api.orders(t))
}

// An HTTP client dials ahead when its connections are busy and may keep
// the spare connection without ever sending a request on it. Such a
// connection does not hold the shutdown (net/http alone would wait 5s for
// it): the server closes it once the sessions are closed.
func TestShutdown_HTTPUnusedConnection_DoesNotHoldIt(t *testing.T) {
	t.Parallel()
	api := startOrderAPI(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	transport, served := serveHTTPOnLoopback(time.Minute)(t, ctx, NewServer(api.URL, &client.Client{HTTP: api.HTTP}))
	endpoint, err := url.Parse(transport.(*mcp.StreamableClientTransport).Endpoint)
	require.NoError(t, err)
	unused, err := net.Dial("tcp", endpoint.Host)
	require.NoError(t, err)
	defer unused.Close()
	// The server accepts in order, so once a later connection's session
	// answers, the unused one has been accepted too.
	cs := connectSession(t, transport)
	res, out := callTool(t, cs, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 1))
	require.False(t, res.IsError, text(res))
	require.NotNil(t, out.Order)

	cancel()
	require.NoError(t, waitFor(t, served, 3*time.Second))
	require.NoError(t, unused.SetReadDeadline(time.Now().Add(time.Second)))
	_, err = unused.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closes the unused connection")
}

type answer struct {
	res *mcp.CallToolResult
	err error
}

func callInBackground(cs *mcp.ClientSession, tool string, args map[string]any) <-chan answer {
	answered := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
		answered <- answer{res, err}
	}()
	return answered
}

// requireStillServing fails if the server returns within 100ms: it must
// wait for the call in flight.
func requireStillServing(t *testing.T, served <-chan error) {
	t.Helper()
	select {
	case err := <-served:
		t.Fatalf("the server returned (%v) before the call in flight finished", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// Shutdown waits for calls in flight only as long as one call may take;
// past that it cuts them off and says so.
func TestShutdown_CallInFlightPastGrace_IsCutOffWithError(t *testing.T) {
	t.Parallel()
	reached, release := make(chan struct{}), make(chan struct{})
	api := startOrderAPI(t, holdFirstRequest(reached, release))
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	transport, served := serveHTTPOnLoopback(200*time.Millisecond)(t, ctx, NewServer(api.URL, &client.Client{HTTP: api.HTTP}))
	cs := connectSession(t, transport)
	callInBackground(cs, "create_order", createArgs(client.KeyFor("run-1", "intent-1"), 1))
	<-reached
	cancel()
	err := waitFor(t, served, 5*time.Second)
	require.ErrorContains(t, err, "calls still running after 200ms were cut off")
}

// holdFirstRequest makes the order API signal reached on its first request
// and hold it until release is closed.
func holdFirstRequest(reached, release chan struct{}) func(*http.Request) {
	var once sync.Once
	return func(*http.Request) {
		once.Do(func() {
			close(reached)
			<-release
		})
	}
}

// serveStdioInMemory runs serveStdio over an in-memory pipe, as the command
// does over stdin/stdout, and returns the client's end.
func serveStdioInMemory(t *testing.T, ctx context.Context, srv *mcp.Server) (mcp.Transport, <-chan error) {
	st, ct := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- serveStdio(ctx, srv, st) }()
	return ct, served
}

// serveHTTPOnLoopback runs serveHTTP with the given grace on a free
// loopback port and returns the SDK's streamable client transport to it.
func serveHTTPOnLoopback(grace time.Duration) func(t *testing.T, ctx context.Context, srv *mcp.Server) (mcp.Transport, <-chan error) {
	return func(t *testing.T, ctx context.Context, srv *mcp.Server) (mcp.Transport, <-chan error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		served := make(chan error, 1)
		go func() { served <- serveHTTP(ctx, ln, srv, grace) }()
		return &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + MCPPath}, served
	}
}

func waitFor(t *testing.T, served <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-served:
		return err
	case <-time.After(d):
		t.Fatalf("the server did not return within %s", d)
		return nil
	}
}

// connectSession connects a test agent over transport and closes the
// session at the end of the test.
func connectSession(t *testing.T, transport mcp.Transport) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(context.Background(), transport, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// connectStdio starts the command as an MCP host does for a "command"
// entry. Closing the session closes its stdin, after which the command
// must exit 0 by itself (CommandTransport would SIGTERM it after 5s).
func connectStdio(t *testing.T, apiURL string) *mcp.ClientSession {
	t.Helper()
	var stderr syncBuffer
	cmd := exec.Command(serverBinary(t), "-api", apiURL)
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, cs.Close(), "the command must exit 0 when stdin closes; stderr:\n%s", stderr.String())
	})
	return cs
}

// connectHTTP starts the command with -http on a free loopback port and
// connects through the SDK's streamable client; the command is stopped with
// SIGTERM at the end of the test and must exit 0.
func connectHTTP(t *testing.T, apiURL string) *mcp.ClientSession {
	t.Helper()
	p := startProcess(t, []string{"-http", "127.0.0.1:0", "-api", apiURL}, nil, nil)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.endpoint(t)}, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, cs.Close())
		require.Equal(t, 0, p.stop(t, syscall.SIGTERM, 5*time.Second), "stderr:\n%s", p.stderr.String())
	})
	return cs
}

// serverProcess is one run of the built command.
type serverProcess struct {
	cmd     *exec.Cmd
	stderr  *syncBuffer
	exited  chan struct{}
	waitErr error // valid once exited is closed
}

// startProcess runs the built command with args; stdin and stdout may be
// nil. It is killed at the end of the test if still running.
func startProcess(t *testing.T, args []string, stdin, stdout *os.File) *serverProcess {
	t.Helper()
	p := &serverProcess{cmd: exec.Command(serverBinary(t), args...), stderr: &syncBuffer{}, exited: make(chan struct{})}
	if stdin != nil {
		p.cmd.Stdin = stdin
	}
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	p.cmd.Stderr = p.stderr
	require.NoError(t, p.cmd.Start())
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

var endpointLine = regexp.MustCompile(`serving MCP over Streamable HTTP at (http://\S+)`)

// endpoint waits for the command to announce its HTTP endpoint.
func (p *serverProcess) endpoint(t *testing.T) string {
	t.Helper()
	var url string
	require.Eventually(t, func() bool {
		if m := endpointLine.FindStringSubmatch(p.stderr.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no endpoint announced; stderr:\n%s", p.stderr)
	return url
}

// stop sends sig and returns the exit status, failing the test if the
// process is still running after d.
func (p *serverProcess) stop(t *testing.T, sig syscall.Signal, d time.Duration) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("still running %s after %s; stderr:\n%s", d, sig, p.stderr.String())
	}
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		t.Fatalf("wait: %v", p.waitErr)
	}
	return p.cmd.ProcessState.ExitCode() // -1 when a signal killed it
}

// syncBuffer is a bytes.Buffer safe for the process's writer and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var binDir string // removed by TestMain

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// serverBinary builds the command once per test run, on first use: the
// signal and stdio tests need the real process.
func serverBinary(t *testing.T) string {
	t.Helper()
	bin, err := buildServer()
	require.NoError(t, err)
	return bin
}

var buildServer = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "mcpserver-test-")
	if err != nil {
		return "", err
	}
	binDir = dir
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(dir, "mcpserver")
	cmd := exec.Command(goTool, "build", "-o", bin, ".") // go test runs in the package directory
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})
