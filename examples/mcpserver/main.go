// Command mcpserver is an MCP server over stdio exposing the example order
// API as the tools create_order, get_order and cancel_order.
//
//	go run ./examples/server &                   # the order API on :8080
//	go run ./examples/mcpserver -api http://127.0.0.1:8080
//
// Flags:
//
//	-api URL          base URL of the order API (default http://127.0.0.1:8080)
//	-timeout D        bound on one HTTP attempt (default 5s)
//	-max-elapsed D    retry budget of one tool call, same key throughout (default 20s)
//	-print-tool NAME  print the named tool's definition as JSON and exit
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
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/orderguard/idempotency/client"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mcpserver:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mcpserver", flag.ContinueOnError)
	apiURL := fs.String("api", "http://127.0.0.1:8080", "base URL of the order API")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on one HTTP attempt")
	maxElapsed := fs.Duration("max-elapsed", 20*time.Second, "retry budget of one tool call (the key stays the same)")
	printTool := fs.String("print-tool", "", "print the named tool's definition as JSON and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	hc := &client.Client{
		HTTP:   &http.Client{Timeout: *timeout},
		Policy: client.Policy{MaxElapsed: *maxElapsed},
	}
	srv := NewServer(*apiURL, hc)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *printTool != "" {
		tool, err := AdvertisedTool(ctx, srv, *printTool)
		if err != nil {
			return err
		}
		b, err := json.MarshalIndent(tool, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Printf("%s\n", b)
		return err
	}
	return srv.Run(ctx, &mcp.StdioTransport{})
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
