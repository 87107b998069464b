package main

// The README's code cannot drift from the library: each ```go block of
// README.md is compiled, as the body of a function, inside a package whose
// module has the snippet's imports (net/http and the payment webhook here,
// gRPC in examples/grpcserver with its generated orderpb, the queue
// consumer in examples/orderconsumer). The file is given to the compiler
// through -overlay: nothing is written into the repository. What a
// snippet takes from around it (a *sql.DB, the Middleware, the service's
// own helpers) is the function's parameters, declared below; a snippet that
// names anything else, or leaves an import or a variable unused, fails to
// compile. Each must also be as gofmt writes it.

import (
	"encoding/json"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeSnippet is where one README snippet compiles and what it is given.
type readmeSnippet struct {
	dir     string   // the package's directory, from the repository's root
	imports []string // the snippet's imports, each as written in an import block
	params  string   // the function's parameters: what the snippet takes from around it
}

// readmeSnippets maps the heading above each ```go block of the README to
// its package and surroundings.
var readmeSnippets = map[string]readmeSnippet{
	"net/http": {
		dir: "examples/server",
		imports: []string{`"database/sql"`, `"encoding/json"`, `"log"`, `"net/http"`,
			`"github.com/orderguard/idempotency"`},
		params: "db *sql.DB, mux *http.ServeMux, userID func(*http.Request) (string, error), newOrderNo func() string",
	},
	"gRPC": {
		dir: "examples/grpcserver",
		imports: []string{`"context"`, `"log"`, `"google.golang.org/grpc"`, `"github.com/orderguard/idempotency"`,
			`"github.com/orderguard/idempotency/examples/grpcserver/orderpb"`, `idemgrpc "github.com/orderguard/idempotency/grpc"`},
		params: "mw *idempotency.Middleware, principal func(context.Context) (string, error), orders orderpb.OrderServiceServer",
	},
	"A queue consumer": {
		dir: "examples/orderconsumer",
		imports: []string{`"context"`, `"database/sql"`, `"log"`, `"github.com/nats-io/nats.go/jetstream"`,
			`"github.com/orderguard/idempotency"`, `idemnats "github.com/orderguard/idempotency/nats"`, `"github.com/orderguard/idempotency/queue"`},
		params: "ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, mw *idempotency.Middleware, " +
			"createFromMessage func(context.Context, *sql.Tx, *queue.Message) idempotency.Result",
	},
	"A payment webhook": {
		dir: "examples/server",
		imports: []string{`"database/sql"`, `"log"`, `"net/http"`, `"os"`,
			`"github.com/orderguard/idempotency"`, `"github.com/orderguard/idempotency/payment"`,
			`idemstripe "github.com/orderguard/idempotency/payment/stripe"`},
		params: "db *sql.DB, mux *http.ServeMux, paymentMW *idempotency.Middleware",
	},
}

func TestReadme_GoSnippets_Compile(t *testing.T) {
	t.Parallel()
	md, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	overlay := map[string]string{}
	dirs := map[string]bool{}
	seen := map[string]bool{}
	tmp := t.TempDir()
	for _, b := range markdownBlocks("README.md", string(md)) {
		if b.lang != "go" {
			continue
		}
		s, ok := readmeSnippets[b.heading]
		require.True(t, ok, "README.md line %d: a go block under %q, which readmeSnippets does not know: add its package and surroundings", b.line, b.heading)
		require.False(t, seen[b.heading], "README.md line %d: a second go block under %q", b.line, b.heading)
		seen[b.heading] = true
		name := fmt.Sprintf("readme_snippet_line%d.go", b.line)
		// The //line directive makes the compiler's messages name README.md's lines.
		src := fmt.Sprintf("package main\n\n// README.md line %d, under %q.\n\nimport (\n\t%s\n)\n\nfunc readmeSnippetLine%d(%s) {\n//line README.md:%d\n%s}\n",
			b.line, b.heading, strings.Join(s.imports, "\n\t"), b.line, s.params, b.line+1, b.text)
		checkSnippetFormat(t, b, s)
		file := filepath.Join(tmp, name)
		require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
		dir, err := filepath.Abs(filepath.Join(repoRoot, s.dir))
		require.NoError(t, err)
		overlay[filepath.Join(dir, name)] = file
		dirs[dir] = true
	}
	for heading := range readmeSnippets {
		require.True(t, seen[heading], "README.md has no go block under %q: one example per entry point", heading)
	}

	js, err := json.Marshal(map[string]any{"Replace": overlay})
	require.NoError(t, err)
	overlayFile := filepath.Join(tmp, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, js, 0o644))
	args := []string{"build", "-overlay", overlayFile}
	for dir := range dirs {
		args = append(args, dir)
	}
	cmd := exec.Command(goTool(), args...) // several packages: compiled, nothing written
	cmd.Dir = filepath.Join(repoRoot)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the README's go blocks do not compile:\n%s", out)
}

// goTool is the go command that runs the tests.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// checkSnippetFormat fails unless the snippet is as gofmt writes it: the
// body of a function, one tab less.
func checkSnippetFormat(t *testing.T, b mdBlock, s readmeSnippet) {
	t.Helper()
	var body strings.Builder
	for line := range strings.Lines(b.text) {
		if strings.TrimSpace(line) == "" {
			body.WriteString("\n")
			continue
		}
		body.WriteString("\t" + line)
	}
	src := "package main\n\nfunc snippet(" + s.params + ") {\n" + body.String() + "}\n"
	formatted, err := format.Source([]byte(src))
	require.NoError(t, err, "README.md line %d: the go block does not parse", b.line)
	got := strings.TrimPrefix(string(formatted), "package main\n\nfunc snippet("+s.params+") {\n")
	got = strings.TrimSuffix(got, "}\n")
	var want strings.Builder
	for line := range strings.Lines(got) {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	require.Equal(t, want.String(), b.text, "README.md line %d: the go block is not gofmt'd", b.line)
}
