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
	"net"
	"strings"

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
	port, full := r.grpcArgs(c, args, true)
	r.background(c, "grpc:"+port, grpcServerBinary, full, "msg=listening")
}

// grpcCall runs the gRPC client and returns what it prints.
func (r *readmeRun) grpcCall(c consoleCommand, args []string) string {
	_, full := r.grpcArgs(c, args, false)
	return r.foreground(c, grpcServerBinary, append([]string{"call"}, full...))
}
