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
	"strings"

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
	r.background(c, "orderconsumer", orderConsumerBinary, r.consumerArgs(c, args), "msg=consuming")
}

// publish runs the publisher and returns what it prints; its exit status
// is the command's.
func (r *readmeRun) publish(c consoleCommand, args []string) string {
	full := r.consumerArgs(c, args)
	for i, a := range full { // the publisher takes no -db
		if a == "-db" {
			full = append(full[:i:i], full[i+2:]...)
			break
		}
	}
	// As for curl: a body without a line break (problem+json) has one on
	// the terminal, before the next prompt.
	out := r.foreground(c, orderConsumerBinary, append([]string{"publish"}, full...))
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}
