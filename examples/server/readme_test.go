package main

// The README and the guides cannot drift from the server:
// TestReadme_ConsoleBlocks runs every ```console block of README.md and of
// each guide in docs/ (see readmeDocuments), each document in order and on
// its own fresh servers and databases, as a newcomer following it would,
// against the real server binary (and the real queue consumer and idemctl
// where a document runs them: readme_console_queue_test.go,
// readme_console_idemctl_test.go), and compares each command's output with
// what the document shows: for curl -i the status line, every header but
// Date (which the documents leave out) and the body; for curl -s the body;
// for echo $? the exit status curl would have had. Then it makes the MCP
// call of docs/agents.md through the real mcpserver over stdio and compares
// its result. A ```sh or ```text block is shown, never run: a command a
// guide promises to work belongs in a console block.
//
// What differs from the README, explicitly and narrowly:
//   - `go run ./examples/server ARGS &` starts the built binary (built once,
//     as crash_test.go does) with ARGS, in a working directory of the
//     test's, and waits until /healthz answers. A server started on an
//     address where one runs replaces it: the README says to stop the
//     first. Its output is its log, never compared.
//   - Addresses: each port the README names (8080 by default, -addr,
//     curl's URL) is a free port of the test's, the same port each time.
//   - Databases: each -db URL the README names is a fresh database of that
//     dialect, the same one each time it is named; the default
//     (sqlite://orders.db) is the variant's database: SQLite as a newcomer
//     runs it, then MariaDB and PostgreSQL.
//   - -redis ADDR is the test's Redis, under a key prefix of the test's own
//     (-redis-prefix), so that runs sharing one Redis never answer each
//     other, and with -redis-timeout readmeRedisTimeout: the README shows
//     a replay from Redis, and at the default 50 ms a busy machine (a load
//     average of 19, seen) made a call a miss, replayed from the database
//     instead (source="store"): right, but not what the README shows.
//   - Order numbers are random: each one the README shows stands for the
//     one the server made at that point, the same each time it is shown
//     (volatile).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// readmeRedisTimeout bounds the README servers' Redis calls (see above).
const readmeRedisTimeout = "5s"

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// readmeDocuments are the documents whose console blocks run: README.md,
// then every guide in docs/, in the order of their names. Each runs as a
// reader who opens it alone would run it: on fresh servers, databases,
// ports and working directory (a guide starts the servers it needs).
func readmeDocuments(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	docs := []string{"README.md"}
	for _, g := range guides {
		docs = append(docs, "docs/"+filepath.Base(g))
	}
	return docs
}

// readmeRequiredBlocks are the console blocks that must stay, by
// document and heading: a document that lost its blocks must not pass by
// running nothing.
var readmeRequiredBlocks = []struct {
	file, heading string
	atLeast       int
}{
	{"README.md", "A first order, its retry, a changed retry", 1},
	{"README.md", "A first gRPC call, a first consumed message", 1},
	{"docs/queues.md", "Try it", 1},
	{"docs/getting-started.md", "Walkthrough", 5},
	{"docs/operations.md", "Prometheus", 1},
	{"docs/operations.md", "Operator CLI", 1},
	{"docs/scaling.md", "Try it: two instances, one Redis", 1},
}

// readmeMCPDocument holds the MCP tool server's commands and its
// create_order call, which the test makes through the real mcpserver.
const readmeMCPDocument = "docs/agents.md"

func TestReadme_ConsoleBlocks_AnswerAsShown(t *testing.T) {
	t.Parallel()
	type document struct {
		file    string
		console []mdBlock
	}
	var docs []document
	found := map[[2]string]int{}
	var mcpCall, mcpResult mdBlock
	var mcpKeyIDs [2]string
	var mcpRun []consoleCommand
	for _, file := range readmeDocuments(t) {
		md, err := os.ReadFile(filepath.Join(repoRoot, file))
		require.NoError(t, err)
		blocks := markdownBlocks(file, string(md))
		d := document{file: file}
		for _, b := range blocks {
			if b.lang == "console" {
				d.console = append(d.console, b)
				found[[2]string{file, b.heading}]++
			}
		}
		docs = append(docs, d)
		if file == readmeMCPDocument {
			mcpCall, mcpResult, mcpKeyIDs = readmeMCPExample(t, string(md), blocks)
			mcpRun = readmeMCPRun(t, blocks)
		}
	}
	for _, want := range readmeRequiredBlocks {
		require.GreaterOrEqual(t, found[[2]string{want.file, want.heading}], want.atLeast,
			"console blocks in %s under %q", want.file, want.heading)
	}
	require.NotNil(t, mcpRun, "%s: the MCP tool server's commands", readmeMCPDocument)

	for _, variant := range []string{"sqlite", "mysql", "postgres"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			for _, d := range docs {
				if len(d.console) == 0 && d.file != readmeMCPDocument {
					continue
				}
				t.Run(strings.TrimSuffix(filepath.Base(d.file), ".md"), func(t *testing.T) {
					r := newReadmeRun(t, variant)
					for _, b := range d.console {
						cmds, err := parseConsole(b)
						require.NoError(t, err)
						for _, c := range cmds {
							r.run(c)
						}
					}
					if d.file == readmeMCPDocument {
						r.mcp(mcpRun, mcpCall, mcpResult, mcpKeyIDs)
					}
				})
			}
		})
	}
}

// readmeMCPExample finds the MCP section's create_order call, its result
// (the next json block) and the ids its key is made from
// (client.KeyFor("run", "call") in the text between them and the section).
func readmeMCPExample(t *testing.T, md string, blocks []mdBlock) (call, result mdBlock, keyIDs [2]string) {
	t.Helper()
	for i, b := range blocks {
		if b.lang == "json" && strings.Contains(b.text, `"tool": "create_order"`) {
			require.Less(t, i+1, len(blocks), "%s line %d: the MCP call's result block", b.file, b.line)
			call, result = b, blocks[i+1]
			require.Equal(t, "json", result.lang, "%s line %d: the MCP call's result is the next json block", result.file, result.line)
			break
		}
	}
	require.NotZero(t, call.line, "the README's MCP section shows a create_order call")
	lines := strings.Split(md, "\n")
	before := strings.Join(lines[max(0, call.line-6):call.line], "\n")
	m := regexp.MustCompile(`client\.KeyFor\("([^"]+)", "([^"]+)"\)`).FindStringSubmatch(before)
	require.NotNil(t, m, "%s line %d: the text before the MCP call names the key as client.KeyFor(\"run\", \"call\")", call.file, call.line)
	return call, result, [2]string{m[1], m[2]}
}

// readmeMCPRun finds the commands of "Run the MCP tool server": the order
// API, then the MCP server over stdio (the first two lines of its sh block;
// the third is the HTTP alternative).
func readmeMCPRun(t *testing.T, blocks []mdBlock) []consoleCommand {
	t.Helper()
	for _, b := range blocks {
		if b.lang != "sh" || !strings.Contains(b.text, "go run ./examples/mcpserver -api") {
			continue
		}
		lines := strings.Split(b.text, "\n")
		require.GreaterOrEqual(t, len(lines), 2, "%s line %d", b.file, b.line)
		return []consoleCommand{{file: b.file, line: b.line + 1, source: lines[0]}, {file: b.file, line: b.line + 2, source: lines[1]}}
	}
	t.Fatal("the README's MCP section shows how to run the order API and the MCP server (go run ./examples/mcpserver -api …)")
	return nil
}

// readmeRun is one run of the README: its servers, databases and the
// order numbers it has seen.
type readmeRun struct {
	t       *testing.T
	variant string
	dir     string // the servers' working directory (./orders.db)
	redis   struct {
		addr, prefix string
	}
	queue struct { // the consumer's broker, stream and subject (readme_console_queue_test.go)
		broker, stream, subject string
	}

	ports   map[string]string        // README port → the test's host:port
	dbs     map[string]string        // README -db URL → the test's
	servers map[string]*readmeServer // by README port
	logs    *os.File
	orders  *volatile
	status  int // the exit status of the last command, for echo $?
}

func newReadmeRun(t *testing.T, variant string) *readmeRun {
	t.Helper()
	r := &readmeRun{t: t, variant: variant, dir: t.TempDir(), ports: map[string]string{}, dbs: map[string]string{},
		servers: map[string]*readmeServer{}, orders: newVolatile()}
	var err error
	r.logs, err = os.Create(filepath.Join(t.TempDir(), "servers.log"))
	require.NoError(t, err)
	t.Cleanup(func() {
		for port := range r.servers {
			r.stop(port)
		}
		_ = r.logs.Close()
		if t.Failed() {
			out, _ := os.ReadFile(r.logs.Name())
			t.Logf("servers' log:\n%s", out)
		}
	})
	return r
}

// run runs one README command and compares its output.
func (r *readmeRun) run(c consoleCommand) {
	t := r.t
	t.Helper()
	pipelines, err := shellParse(c.source)
	require.NoError(t, err, "%s line %d", c.file, c.line)
	var out strings.Builder
	for _, p := range pipelines {
		out.WriteString(r.pipeline(c, p))
	}
	want := c.output
	got := out.String()
	ok, why := r.orders.match(want, got)
	require.True(t, ok, "%s line %d: `%s`\nthe document shows:\n%s\nthe server's answer prints:\n%s\n%s",
		c.file, c.line, c.source, want, got, why)
}

// pipeline runs one pipeline and returns what it prints.
func (r *readmeRun) pipeline(c consoleCommand, p shellPipeline) string {
	t := r.t
	t.Helper()
	first := p.commands[0]
	switch {
	case len(first) >= 3 && first[0] == "go" && first[1] == "run" && first[2] == "./examples/server":
		require.True(t, p.background, "%s line %d: the server runs in the background (&)", c.file, c.line)
		require.Len(t, p.commands, 1, "%s line %d", c.file, c.line)
		r.startServer(c, first[3:])
		return ""
	case len(first) >= 3 && first[0] == "go" && first[1] == "run" && first[2] == "./examples/orderconsumer":
		require.Len(t, p.commands, 1, "%s line %d", c.file, c.line)
		if len(first) > 3 && first[3] == "publish" {
			require.False(t, p.background, "%s line %d: the publisher runs in the foreground", c.file, c.line)
			return r.publish(c, first[4:])
		}
		require.True(t, p.background, "%s line %d: the consumer runs in the background (&)", c.file, c.line)
		r.startConsumer(c, first[3:])
		return ""
	case len(first) >= 3 && first[0] == "go" && first[1] == "run" && first[2] == "./examples/grpcserver":
		require.Len(t, p.commands, 1, "%s line %d", c.file, c.line)
		if len(first) > 3 && first[3] == "call" {
			require.False(t, p.background, "%s line %d: the client runs in the foreground", c.file, c.line)
			return r.grpcCall(c, first[4:])
		}
		require.True(t, p.background, "%s line %d: the gRPC server runs in the background (&)", c.file, c.line)
		r.startGRPC(c, first[3:])
		return ""
	case len(first) >= 3 && first[0] == "go" && first[1] == "run" && first[2] == "./cmd/idemctl":
		require.False(t, p.background, "%s line %d: idemctl runs in the foreground", c.file, c.line)
		out := r.idemctl(c, first[3:])
		for _, next := range p.commands[1:] {
			out = r.grep(c, next, out)
		}
		return out
	case p.background:
		t.Fatalf("%s line %d: only the server runs in the background, not %q", c.file, c.line, first)
	case first[0] == "curl":
		out := r.curl(c, first)
		for _, next := range p.commands[1:] {
			out = r.grep(c, next, out)
		}
		return out
	case len(p.commands) > 1:
		t.Fatalf("%s line %d: a pipeline from %q", c.file, c.line, first)
	case first[0] == "echo" && len(first) == 2 && first[1] == "$?":
		return strconv.Itoa(r.status) + "\n"
	case first[0] == "sleep" && len(first) == 2:
		d, err := strconv.ParseFloat(first[1], 64)
		require.NoError(t, err, "%s line %d", c.file, c.line)
		time.Sleep(time.Duration(d * float64(time.Second))) // what the README tells the reader to do
		r.status = 0
		return ""
	}
	t.Fatalf("%s line %d: readme_test.go cannot run %q: teach it, or show the README something it runs", c.file, c.line, first)
	return ""
}

// startServer starts the server binary with the README's arguments, the
// test's address, databases and Redis in their place.
func (r *readmeRun) startServer(c consoleCommand, args []string) {
	t := r.t
	t.Helper()
	port := "8080"
	db := ""
	var rest []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		if i+1 >= len(args) && (name == "addr" || name == "db" || name == "redis") {
			t.Fatalf("%s line %d: %s needs a value", c.file, c.line, args[i])
		}
		switch name {
		case "addr":
			_, p, err := net.SplitHostPort(args[i+1])
			require.NoError(t, err, "%s line %d: -addr", c.file, c.line)
			port = p
			i++
		case "db":
			db = args[i+1]
			i++
		case "redis":
			rest = append(rest, "-redis", r.redisAddr(), "-redis-prefix", r.redis.prefix, "-redis-timeout", readmeRedisTimeout)
			i++
		default:
			rest = append(rest, args[i])
		}
	}
	if _, running := r.servers[port]; running {
		r.stop(port) // the README stops it first
	}
	bin, err := crashServerBinary()
	require.NoError(t, err)
	full := append([]string{"-addr", r.addr(port), "-db", r.database(db)}, rest...)
	cmd := exec.Command(bin, full...)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	fmt.Fprintf(r.logs, "=== %s line %d: server %q\n", c.file, c.line, full)
	require.NoError(t, cmd.Start())
	s := &readmeServer{cmd: cmd, done: make(chan struct{})}
	r.servers[port] = s
	go func() {
		s.err = cmd.Wait()
		fmt.Fprintf(r.logs, "=== server on README port %s ended: %v\n", port, s.err)
		close(s.done)
	}()
	r.waitReady(c, port, s)
}

// readmeServer is one server process the document started (a consumer
// too).
type readmeServer struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has ended
	err  error         // Wait's, once done
}

func (r *readmeRun) waitReady(c consoleCommand, port string, s *readmeServer) {
	t := r.t
	t.Helper()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			t.Fatalf("%s line %d: the server exited before it answered /healthz: %v", c.file, c.line, s.err)
		default:
		}
		resp, err := hc.Get("http://" + r.addr(port) + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s line %d: the server did not answer /healthz within 30s", c.file, c.line)
}

// stop ends the server on a README port as Ctrl-C does, and waits for it.
func (r *readmeRun) stop(port string) {
	s := r.servers[port]
	delete(r.servers, port)
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		r.t.Errorf("the server on README port %s did not stop within 15s of SIGINT", port)
	}
}

// addr is the test's address for a README port.
func (r *readmeRun) addr(port string) string {
	if a, ok := r.ports[port]; ok {
		return a
	}
	a := crashFreePort(r.t)
	r.ports[port] = a
	return a
}

// database is the test's -db URL for the README's (""  is the default).
func (r *readmeRun) database(readme string) string {
	t := r.t
	if readme == "" || readme == "sqlite://orders.db" {
		readme = ""
	}
	if u, ok := r.dbs[readme]; ok {
		return u
	}
	dialect := r.variant
	switch {
	case readme == "":
	case strings.HasPrefix(readme, "sqlite://"):
		dialect = "sqlite"
	case strings.HasPrefix(readme, "mysql://"):
		dialect = "mysql"
	case strings.HasPrefix(readme, "postgres://"):
		dialect = "postgres"
	default:
		t.Fatalf("the README's -db %q: no such dialect", readme)
	}
	var u string
	switch dialect {
	case "sqlite":
		u = "sqlite://orders.db" // in the run's working directory, as a newcomer's
		if readme != "" {
			u = "sqlite://" + filepath.Base(strings.TrimPrefix(readme, "sqlite://"))
		}
	case "mysql":
		_, dsn := testdb.MySQL(t)
		u = "mysql://" + dsn
	case "postgres":
		_, u = pgtest.Postgres(t)
	}
	r.dbs[readme] = u
	return u
}

// redisAddr is the test's Redis; its keys go under a prefix of this run's,
// deleted at the end.
func (r *readmeRun) redisAddr() string {
	if r.redis.addr != "" {
		return r.redis.addr
	}
	r.redis.addr = redisAddr(r.t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	r.redis.prefix = "readme-test:" + hex.EncodeToString(b[:]) + ":"
	r.t.Cleanup(func() {
		rdb := redis.NewClient(&redis.Options{Addr: r.redis.addr})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, _ := rdb.Keys(ctx, r.redis.prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	return r.redis.addr
}

// curl sends the README's request and returns what curl would print; it
// sets the exit status curl would have: 0 for an answer, 28 for
// --max-time running out, 7 for a refused connection.
func (r *readmeRun) curl(c consoleCommand, words []string) string {
	t := r.t
	t.Helper()
	call, err := parseCurl(words)
	require.NoError(t, err, "%s line %d", c.file, c.line)
	_, port, err := net.SplitHostPort(call.hostPort)
	require.NoError(t, err, "%s line %d: the URL's host:port", c.file, c.line)
	require.Contains(t, []string{"localhost", "127.0.0.1"}, strings.Split(call.hostPort, ":")[0], "%s line %d", c.file, c.line)
	path, err := r.orders.substitute(call.path)
	require.NoError(t, err, "%s line %d", c.file, c.line)
	var body io.Reader
	if call.data != nil {
		d, err := r.orders.substitute(*call.data)
		require.NoError(t, err, "%s line %d", c.file, c.line)
		body = strings.NewReader(d)
	}
	req, err := http.NewRequest(call.method, "http://"+r.addr(port)+path, body)
	require.NoError(t, err)
	for _, h := range call.headers {
		req.Header.Add(h[0], h[1])
	}
	if call.data != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if call.maxTime > 0 {
		hc.Timeout = time.Duration(call.maxTime * float64(time.Second))
	}
	resp, err := hc.Do(req)
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		r.status = 28
		return ""
	case errors.Is(err, syscall.ECONNREFUSED):
		r.status = 7
		return ""
	}
	require.NoError(t, err, "%s line %d", c.file, c.line)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r.status = 0
	// curl prints the body as it is; the README ends every output with a
	// line break, which a body without one (problem+json) has only on the
	// terminal. Content-Length, compared with the headers, counts the bytes.
	out := string(b)
	if !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return curlOutput(call.include, resp.Proto, resp.Status, resp.Header, map[string]bool{"Date": true}, out)
}

// grep filters text as `grep PATTERN` does, the pattern read as plain text
// (the README's have no character that a basic regular expression reads
// otherwise).
func (r *readmeRun) grep(c consoleCommand, words []string, text string) string {
	t := r.t
	t.Helper()
	require.True(t, len(words) == 2 && words[0] == "grep", "%s line %d: readme_test.go pipes only into grep PATTERN, not %q", c.file, c.line, words)
	re, err := regexp.Compile(regexp.QuoteMeta(words[1]))
	require.NoError(t, err)
	var out strings.Builder
	for line := range strings.Lines(text) {
		if re.MatchString(line) {
			out.WriteString(line)
		}
	}
	if out.Len() == 0 {
		r.status = 1
	}
	return out.String()
}

// mcp runs the README's "Run the MCP tool server" commands (the order API
// in the background, then the MCP server, which an MCP host starts and
// speaks to over stdio: this test is that host), makes the README's
// create_order call, and compares the result.
func (r *readmeRun) mcp(run []consoleCommand, call, result mdBlock, keyIDs [2]string) {
	t := r.t
	t.Helper()
	var in struct {
		Tool      string         `json:"tool"`
		Arguments map[string]any `json:"arguments"`
	}
	require.NoError(t, json.Unmarshal([]byte(call.text), &in), "%s line %d", call.file, call.line)
	require.Equal(t, client.KeyFor(keyIDs[0], keyIDs[1]), in.Arguments["idempotency_key"],
		"%s line %d: the key shown is client.KeyFor(%q, %q)", call.file, call.line, keyIDs[0], keyIDs[1])

	r.run(run[0]) // the order API
	pipelines, err := shellParse(run[1].source)
	require.NoError(t, err, "%s line %d", run[1].file, run[1].line)
	words := pipelines[0].commands[0]
	require.True(t, len(pipelines) == 1 && !pipelines[0].background && len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./examples/mcpserver",
		"%s line %d: go run ./examples/mcpserver ARGS, not %q", run[1].file, run[1].line, run[1].source)
	args := slices.Clone(words[3:])
	for i := range args {
		if args[i] == "-api" && i+1 < len(args) {
			_, port, err := net.SplitHostPort(strings.TrimPrefix(args[i+1], "http://"))
			require.NoError(t, err, "%s line %d: -api", run[1].file, run[1].line)
			args[i+1] = "http://" + r.addr(port)
		}
	}
	bin, err := mcpServerBinary()
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = r.logs
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "readme-test", Version: "v0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: in.Tool, Arguments: in.Arguments})
	require.NoError(t, err)
	got, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	require.False(t, res.IsError, "%s line %d: the call fails: %s", call.file, call.line, got)

	var want any
	require.NoError(t, json.Unmarshal([]byte(result.text), &want), "%s line %d", result.file, result.line)
	wantJSON, err := json.Marshal(want) // keys sorted, as got's
	require.NoError(t, err)
	ok, why := r.orders.match(string(wantJSON), string(got))
	require.True(t, ok, "%s line %d: the README shows the result\n%s\nthe call returned\n%s\n%s", result.file, result.line, wantJSON, got, why)
}

// mcpServerBinary builds examples/mcpserver once per test binary run.
var mcpServerBinary = sync.OnceValues(func() (string, error) {
	server, err := crashServerBinary() // its directory is removed at the end
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(server), "mcpserver")
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Dir = "../mcpserver"
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build mcpserver: %v\n%s", err, out)
	}
	return bin, nil
})
