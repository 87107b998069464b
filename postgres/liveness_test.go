package postgres_test

import (
	"bytes"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/postgres"
)

// socketPair is a connected pair of loopback TCP connections.
func socketPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// readBlocked reads from c until it fails, as pgx's background reader
// does: it can sit in a read on an idle pooled connection until the next
// query's answer comes.
func readBlocked(c net.Conn, done chan<- struct{}) {
	defer close(done)
	_, _ = c.Read(make([]byte, 64))
}

// inIOWait reports whether a goroutine running fn waits in the network
// poller.
func inIOWait(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[IO wait")) && bytes.Contains(g, []byte(fn)) {
			return true
		}
	}
	return false
}

func TestPeek_SeesAQuietASentAndAResetSocket(t *testing.T) {
	t.Parallel()
	client, server := socketPair(t)
	require.Equal(t, "quiet", postgres.PeekState(client), "an open socket with nothing to read")
	_, err := server.Write([]byte("N"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return postgres.PeekState(client) == "sent" }, 10*time.Second, time.Millisecond,
		"bytes the peer sent unasked")
	require.Equal(t, "sent", postgres.PeekState(client), "a peek reads nothing away")

	client, server = socketPair(t)
	require.NoError(t, server.SetLinger(0))
	require.NoError(t, server.Close())
	require.Eventually(t, func() bool { return postgres.PeekState(client) == "gone" }, 10*time.Second, time.Millisecond,
		"a socket the peer reset")

	client, server = socketPair(t)
	require.NoError(t, server.Close())
	require.Eventually(t, func() bool { return postgres.PeekState(client) == "gone" }, 10*time.Second, time.Millisecond,
		"a socket the peer closed")
}

// pgx starts a background read while a write might block and stops it
// only after that read returns, so a pooled connection can sit in the pool
// with a read pending on its socket. The peek at checkout must not wait for
// it: it would wait until the next query's answer, which never comes.
func TestPeek_DoesNotWaitForAReadPendingOnTheSocket(t *testing.T) {
	t.Parallel()
	client, server := socketPair(t)
	done := make(chan struct{})
	go readBlocked(client, done)
	require.Eventually(t, func() bool { return inIOWait("postgres_test.readBlocked") }, 10*time.Second, time.Millisecond,
		"the read is pending")

	state := make(chan string, 1)
	go func() { state <- postgres.PeekState(client) }()
	select {
	case s := <-state:
		require.Equal(t, "quiet", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the peek waited for the pending read")
	}
	_, err := server.Write([]byte("Z"))
	require.NoError(t, err)
	<-done
}
