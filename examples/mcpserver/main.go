// Command mcpserver is an MCP server exposing the example order API as the
// tools create_order, get_order and cancel_order, over stdio (the default)
// or Streamable HTTP (-http).
//
//	go run ./examples/server &                   # the order API on :8080
//	go run ./examples/mcpserver -api http://127.0.0.1:8080                       # stdio
//	go run ./examples/mcpserver -http 127.0.0.1:8090 -api http://127.0.0.1:8080  # http://127.0.0.1:8090/mcp
//
// Flags:
//
//	-api URL          base URL of the order API (default http://127.0.0.1:8080)
//	-http ADDR        serve Streamable HTTP at http://ADDR/mcp instead of stdio
//	-timeout D        bound on one HTTP attempt (default 5s)
//	-max-elapsed D    retry budget of one tool call, same key throughout (default 20s)
//	-print-tool NAME  print the named tool's definition as JSON and exit
//
// # Transports
//
// Without -http the server speaks MCP over stdin/stdout with the one client
// that started it, and ends when that client closes stdin. With -http it
// serves any number of sessions at /mcp through the go-sdk's Streamable HTTP
// handler and prints the endpoint's URL on stderr once it listens (port 0
// picks a free one). Both call the order API at -api with the same retrying
// client.
//
// The user is the user_id argument of each call, sent as X-User-ID: the
// example API's stand-in for authentication, the same over both transports.
// The HTTP endpoint adds no authentication of its own, so whoever reaches it
// can order as any user: keep it on a loopback address (a warning is printed
// otherwise), where the SDK also refuses requests whose Host header is not
// a loopback name, against DNS rebinding from a browser.
//
// # Shutdown
//
// SIGINT and SIGTERM end the server with exit status 0 on both transports.
// A tool call in flight is finished first, so that its request to the API
// is not cut halfway. Over HTTP its answer is delivered too, so an order it
// created is reported rather than left an unknown outcome: the listener
// closes, the requests in flight finish, then every session closes (which
// ends the clients' open event streams). Over stdio the SDK writes no
// answer on a closing session (and a host has usually closed stdin by
// then). The wait is bounded by one call's budget: -max-elapsed plus
// -timeout, plus a second to deliver the answer; an HTTP server still busy
// after that cuts the remaining calls and exits 1. A second signal ends the
// process at once. A call that got no answer is safe to repeat with the
// same idempotency_key: it replays.
//
// # Idempotency keys
//
// create_order and cancel_order take a required idempotency_key, which the
// agent runtime fills in, not the model: it derives the key with
// client.KeyFor(runID, toolCallID), so a retried or re-executed tool call
// and a resumed conversation send the same key without storing anything, or
// it holds one key per user intent (client.NewKey, persisted with the
// intent) so that a re-planned call for the same intent reuses it too. The
// server refuses a call without a valid key before sending anything, and
// passes the key through unchanged as the Idempotency-Key header: it never
// makes one up, since a key invented per call would turn every retry into a
// new order. docs/create_order.tool.json is the published schema.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/orderguard/idempotency/client"

	"github.com/orderguard/idempotency/examples/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one ends the process at once instead
	// of waiting for the calls in flight.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpserver:", err)
		os.Exit(1)
	}
}

// help is what -h prints: what the tool server needs running, and its flags.
var help = cli.Help{
	Usage: "go run ./examples/mcpserver [flags]",
	About: "An MCP tool server (stdio by default) whose create_order, get_order and cancel_order tools call the order API " +
		"with one Idempotency-Key per tool call, reused on every retry.",
	Needs: "the order API at -api (go run ./examples/server, in another terminal). " +
		"The tool server starts without it; its tool calls fail until the API answers.",
	Examples: []string{"go run ./examples/mcpserver -api http://127.0.0.1:8080", "go run ./examples/mcpserver -print-tool create_order"},
	Groups: []cli.Group{
		cli.Flags("Order API", "api", "timeout", "max-elapsed"),
		cli.Flags("MCP", "http", "print-tool"),
	},
}

// run parses args and serves until the client leaves (stdio) or ctx is done;
// a done ctx is a requested shutdown and returns nil.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcpserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	apiURL := fs.String("api", "http://127.0.0.1:8080", "base URL of the order API")
	httpAddr := fs.String("http", "", "serve MCP over Streamable HTTP at http://`ADDR`"+MCPPath+" instead of stdio")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on one HTTP attempt")
	maxElapsed := fs.Duration("max-elapsed", 20*time.Second, "retry budget of one tool call (the key stays the same)")
	printTool := fs.String("print-tool", "", "print the named tool's definition as JSON and exit")
	help.Install(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the help is printed
		}
		return err
	}
	hc := &client.Client{
		HTTP:   &http.Client{Timeout: *timeout},
		Policy: client.Policy{MaxElapsed: *maxElapsed},
	}
	srv := NewServer(*apiURL, hc)
	if *printTool != "" {
		tool, err := AdvertisedTool(ctx, srv, *printTool)
		if err != nil {
			return err
		}
		b, err := json.MarshalIndent(tool, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	if *httpAddr == "" {
		return serveStdio(ctx, srv, &mcp.StdioTransport{})
	}
	ln, err := cli.Listen("http", *httpAddr)
	if err != nil {
		return err
	}
	if !isLoopback(ln.Addr()) {
		fmt.Fprintf(stderr, "mcpserver: warning: %s is not a loopback address and the endpoint has no authentication: anyone who reaches it can order as any user_id\n", ln.Addr())
	}
	fmt.Fprintf(stderr, "mcpserver: serving MCP over Streamable HTTP at http://%s%s (order API %s)\n", ln.Addr(), MCPPath, *apiURL)
	// One call's whole budget, plus a second to deliver its answer.
	grace := *maxElapsed + *timeout + time.Second
	return serveHTTP(ctx, ln, srv, grace)
}

// AdvertisedTool connects an in-memory client to srv and returns the named
// tool exactly as tools/list advertises it.
func AdvertisedTool(ctx context.Context, srv *mcp.Server, name string) (*mcp.Tool, error) {
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "print-tool", Version: Version}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		if tool.Name == name {
			return tool, nil
		}
	}
	return nil, fmt.Errorf("no tool %q", name)
}
