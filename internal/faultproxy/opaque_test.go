package faultproxy_test

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/faultproxy"
)

// An Opaque proxy forwards any protocol's bytes as they are (a broker's,
// here an echo), and Reset ends every open connection at once with an RST
// while the listener keeps accepting.
func TestFaultProxy_Opaque_ForwardsAnyBytes_ResetEndsEveryConnectionNow(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := faultproxy.Start(ln.Addr().String(), faultproxy.WithProtocol(faultproxy.Opaque))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })

	echo := func(c net.Conn, msg string) {
		t.Helper()
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		got := make([]byte, len(msg))
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}
	c1, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c1.Close()
	echo(c1, "AMQP\x00\x00\x09\x01 and \x03COMMIT bytes pass through unparsed")

	require.Equal(t, 1, p.Reset(), "one open connection reset")
	require.NoError(t, c1.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c1.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Equal(t, faultproxy.ResetStats{Rounds: 1, Links: 1}, p.ResetStats())

	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "the proxy still accepts")
	defer c2.Close()
	echo(c2, "again")
}
