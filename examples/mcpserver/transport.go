package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPPath is the path -http serves the Streamable HTTP endpoint at.
const MCPPath = "/mcp"

// serveStdio runs one MCP session over t (stdin/stdout in the command) until
// the client closes it or ctx is done. A done ctx is a requested shutdown,
// not a failure: Run has then closed the session, so serveStdio returns nil
// and a supervisor's SIGTERM does not read as a crash.
//
// Closing waits for the tool call in flight to finish, so its request to
// the API is not cut halfway, but the SDK writes no answer on a closing
// connection: the client sees the session end, and repeating the call with
// the same idempotency_key replays what it did. (A host usually closes
// stdin before it signals, and after that no answer could be written
// anyway.)
func serveStdio(ctx context.Context, srv *mcp.Server, t mcp.Transport) error {
	err := srv.Run(ctx, t)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// serveHTTP serves srv over Streamable HTTP at MCPPath on ln, one MCP
// session per client, until ctx is done; then it shuts down within grace
// and returns nil.
//
// Shutdown closes the listener and turns keep-alives off, then waits for
// the POSTs in flight: a POST carrying a tool call ends once its answer is
// delivered, so an order created during the shutdown is reported. Only then
// are the MCP sessions closed, which ends each client's open event stream
// (the GET of the standalone SSE stream) that http.Server.Shutdown would
// otherwise wait for until grace ran out; closing a session earlier would
// drop the answers of its calls, since the SDK writes nothing on a closing
// connection. Last, the connections no request has arrived on are closed:
// an HTTP client dials ahead when its connections are busy and may keep
// the spare one unused, and http.Server.Shutdown would wait 5s for it,
// though any request on it would now find its session closed. grace
// should cover one call (the retry budget plus one attempt). Past it the
// remaining connections are cut and serveHTTP returns an error; a cut-off
// call is still safe to repeat with the same key.
func serveHTTP(ctx context.Context, ln net.Listener, srv *mcp.Server, grace time.Duration) error {
	sessions := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var posts requestsInFlight
	mux := http.NewServeMux()
	mux.Handle(MCPPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet { // GET is the event stream, open for the whole session
			posts.add()
			defer posts.done()
		}
		sessions.ServeHTTP(w, r)
	}))
	var unused unusedConns
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ConnState: unused.track}
	// drain bounds the wait for POSTs; it ends with serveHTTP, at the
	// latest when grace has run out.
	drain, stopDrain := context.WithCancel(context.Background())
	defer stopDrain()
	sessionsClosed := make(chan struct{})
	// Shutdown runs this after closing the listener, so no client can
	// reconnect a stream that closing its session ends.
	hs.RegisterOnShutdown(func() {
		defer close(sessionsClosed)
		if posts.wait(drain) != nil {
			return
		}
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		unused.close()
	})
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}

	shutdown, cancel := context.WithTimeout(drain, grace)
	defer cancel()
	err := hs.Shutdown(shutdown)
	if err == nil {
		select {
		case <-sessionsClosed:
		case <-shutdown.Done():
			err = shutdown.Err()
		}
	}
	if err != nil {
		_ = hs.Close()
		return fmt.Errorf("shutdown: calls still running after %s were cut off: %w", grace, err)
	}
	return nil
}

// unusedConns holds the server's connections that are still in
// http.StateNew: accepted, with no request read from them yet.
type unusedConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track is the server's ConnState hook.
func (u *unusedConns) track(c net.Conn, state http.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if state != http.StateNew {
		delete(u.conns, c)
		return
	}
	if u.conns == nil {
		u.conns = make(map[net.Conn]struct{})
	}
	u.conns[c] = struct{}{}
}

// close closes every connection still unused.
func (u *unusedConns) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		_ = c.Close()
	}
}

// requestsInFlight counts HTTP requests being served and lets a shutdown
// wait for none. (A sync.WaitGroup may not be added to while Wait runs,
// and a request can arrive on a connection Shutdown has not closed yet.)
type requestsInFlight struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed when n drops to 0; nil while nobody waits
}

func (f *requestsInFlight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
}

func (f *requestsInFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 && f.none != nil {
		close(f.none)
		f.none = nil
	}
}

// wait returns nil once no request is in flight, or ctx's error.
func (f *requestsInFlight) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.none == nil {
		f.none = make(chan struct{})
	}
	none := f.none
	f.mu.Unlock()
	select {
	case <-none:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isLoopback reports whether the listener address is a loopback one, where
// the missing authentication of the endpoint is acceptable.
func isLoopback(addr net.Addr) bool {
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && ap.Addr().IsLoopback()
}
