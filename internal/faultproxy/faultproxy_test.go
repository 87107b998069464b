package faultproxy_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/faultproxy"
	"github.com/orderguard/idempotency/internal/testdb"
)

// packet frames a MySQL packet: 3-byte little-endian length, sequence id,
// payload.
func packet(seq byte, payload []byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

func query(q string) []byte { return packet(0, append([]byte{0x03}, q...)) }

// okPacket is what the fake server answers to every packet.
var okPacket = packet(1, []byte{0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00})

// fakeServer reads MySQL packets and answers each with an OK packet. It
// reports every payload it receives and every connection that ends.
type fakeServer struct {
	ln       net.Listener
	payloads chan []byte
	ended    chan error // why each connection ended, as the server read it
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &fakeServer{ln: ln, payloads: make(chan []byte, 1024), ended: make(chan error, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var end error
				defer func() { c.Close(); s.ended <- end }()
				hdr := make([]byte, 4)
				for {
					if _, end = io.ReadFull(c, hdr); end != nil {
						return
					}
					payload := make([]byte, int(hdr[0])|int(hdr[1])<<8|int(hdr[2])<<16)
					if _, end = io.ReadFull(c, payload); end != nil {
						return
					}
					s.payloads <- payload
					if _, end = c.Write(okPacket); end != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

// next returns the next payload the server received.
func (s *fakeServer) next(t *testing.T) []byte {
	t.Helper()
	select {
	case p := <-s.payloads:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("the server received nothing")
		return nil
	}
}

// receivesNothing asserts that no payload arrives for a while.
func (s *fakeServer) receivesNothing(t *testing.T) {
	t.Helper()
	select {
	case p := <-s.payloads:
		t.Fatalf("the server received %q", p)
	case <-time.After(200 * time.Millisecond):
	}
}

func (s *fakeServer) connectionEnds(t *testing.T) {
	t.Helper()
	s.connectionEndsWith(t)
}

// connectionEndsWith waits for a connection to end and returns the error
// the server's read ended with.
func (s *fakeServer) connectionEndsWith(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.ended:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the server's connection stayed open")
		return nil
	}
}

func startProxy(t *testing.T, target string, opts ...faultproxy.Option) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	return c
}

// writeSplit writes b in pieces of 1..max bytes, so that packets and even
// packet headers straddle reads.
func writeSplit(t *testing.T, c net.Conn, b []byte, max int) {
	t.Helper()
	for len(b) > 0 {
		n := min(len(b), 1+rand.IntN(max))
		_, err := c.Write(b[:n])
		require.NoError(t, err)
		b = b[n:]
		time.Sleep(time.Millisecond) // let the proxy read each piece on its own
	}
}

func readOK(t *testing.T, c net.Conn) {
	t.Helper()
	got := make([]byte, len(okPacket))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, okPacket, got)
}

// readsEOF asserts that the connection is cut without a byte arriving.
func readsEOF(t *testing.T, c net.Conn) {
	t.Helper()
	n, err := c.Read(make([]byte, 64))
	require.Zero(t, n, "the client received bytes")
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection stayed open: %v", err)
}

func fired(t *testing.T, p *faultproxy.Proxy) faultproxy.Firing {
	t.Helper()
	select {
	case f := <-p.Fired():
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("the fault never fired")
		return faultproxy.Firing{}
	}
}

func TestFaultProxy_Unarmed_ForwardsEveryPacketIntactWhateverTheReadBoundaries(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	c := dial(t, p)

	big := bytes.Repeat([]byte("x"), 300<<10) // streamed, never buffered whole
	payloads := [][]byte{
		append([]byte{0x03}, "SELECT 1"...),
		append([]byte{0x03}, "COMMIT"...), // unarmed: passes
		append(append([]byte{0x03}, "INSERT INTO t VALUES ('"...), append(big, "')"...)...),
		{0x0e}, // COM_PING
		append([]byte{0x03}, "commit"...),
	}
	var stream []byte
	for _, pl := range payloads {
		stream = append(stream, packet(0, pl)...)
	}
	// Headers and small packets byte by byte; the big one in large pieces.
	writeSplit(t, c, stream[:40], 3)
	writeSplit(t, c, stream[40:], 64<<10)

	for _, want := range payloads {
		require.Equal(t, want, srv.next(t))
	}
	for range payloads {
		readOK(t, c)
	}
	require.Len(t, p.Fired(), 0)
}

func TestFaultProxy_ReplyLost_ForwardsTheCommitThenCutsBothSidesWithoutItsReply(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	const delay = 150 * time.Millisecond
	p := startProxy(t, srv.addr(), faultproxy.WithReplyDelay(delay))
	c := dial(t, p)

	_, err := c.Write(query("SELECT 1"))
	require.NoError(t, err)
	require.Equal(t, "\x03SELECT 1", string(srv.next(t)))
	readOK(t, c)

	p.Arm(faultproxy.ReplyLost)
	require.Equal(t, faultproxy.ReplyLost, p.Armed())
	start := time.Now()
	writeSplit(t, c, query(" commit; "), 2) // split header, any case, trimmed

	require.Equal(t, "\x03 commit; ", string(srv.next(t)), "the server got the COMMIT")
	readsEOF(t, c) // and the client never got the server's OK
	require.GreaterOrEqual(t, time.Since(start), delay, "the server had time to commit")
	srv.connectionEnds(t)
	f := fired(t, p)
	require.Equal(t, faultproxy.ReplyLost, f.Fault)
	require.Equal(t, " commit; ", f.Query)
	require.Equal(t, faultproxy.None, p.Armed(), "a fault fires once")
}

func TestFaultProxy_RequestLost_DropsTheCommitAndWhatFollowsAndCutsBothSides(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	c := dial(t, p)
	p.Arm(faultproxy.RequestLost)

	// One write: the statement before the COMMIT goes through, the COMMIT
	// and everything after it never reach the server.
	var b []byte
	b = append(b, query("UPDATE t SET a = 1")...)
	b = append(b, query("COMMIT")...)
	b = append(b, query("SELECT 2")...)
	_, err := c.Write(b)
	require.NoError(t, err)

	require.Equal(t, "\x03UPDATE t SET a = 1", string(srv.next(t)))
	srv.connectionEnds(t)
	srv.receivesNothing(t)
	// The client may or may not have received the UPDATE's OK before the
	// cut; it never receives anything after it.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c)
	require.True(t, err == nil || !isTimeout(err), "the connection stayed open: %v", err)
	require.True(t, len(rest) == 0 || bytes.Equal(rest, okPacket), "got %q", rest)
	require.Equal(t, faultproxy.RequestLost, fired(t, p).Fault)
}

func TestFaultProxy_LateCommit_CutsTheClientFirstThenDeliversTheCommit(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	const delay = 200 * time.Millisecond
	p := startProxy(t, srv.addr(), faultproxy.WithReplyDelay(delay))
	c := dial(t, p)
	p.Arm(faultproxy.LateCommit)

	start := time.Now()
	_, err := c.Write(query("COMMIT"))
	require.NoError(t, err)
	readsEOF(t, c)
	cutAfter := time.Since(start)
	require.Less(t, cutAfter, delay, "the client was cut before the COMMIT was delivered")

	require.Equal(t, "\x03COMMIT", string(srv.next(t)))
	require.GreaterOrEqual(t, time.Since(start), delay, "the COMMIT was delivered late")
	srv.connectionEnds(t)
	require.Equal(t, faultproxy.LateCommit, fired(t, p).Fault)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestFaultProxy_Armed_FiresOnlyOnACommitCommandAndOnlyOnce(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p := startProxy(t, srv.addr())
	p.Arm(faultproxy.RequestLost)
	c := dial(t, p)

	notCommits := [][]byte{
		query("SELECT 'COMMIT'"),
		query("COMMITTED"),
		query("ROLLBACK"),
		packet(1, append([]byte{0x03}, "COMMIT"...)), // not a command: sequence id 1
		packet(0, append([]byte{0x02}, "COMMIT"...)), // COM_INIT_DB, not COM_QUERY
		packet(0, nil),
	}
	for _, pkt := range notCommits {
		writeSplit(t, c, pkt, 4)
		require.Equal(t, pkt[4:], srv.next(t))
		readOK(t, c)
	}
	require.Equal(t, faultproxy.RequestLost, p.Armed())

	// The first COMMIT, on another connection, fires.
	c2 := dial(t, p)
	_, err := c2.Write(query("COMMIT"))
	require.NoError(t, err)
	readsEOF(t, c2)
	require.Equal(t, faultproxy.RequestLost, fired(t, p).Fault)
	srv.connectionEnds(t)

	// The next COMMIT passes: the fault was consumed.
	_, err = c.Write(query("COMMIT"))
	require.NoError(t, err)
	require.Equal(t, "\x03COMMIT", string(srv.next(t)))
	readOK(t, c)
}

func TestFaultProxy_Close_CutsOpenConnectionsAndStopsListening(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	p, err := faultproxy.Start(srv.addr())
	require.NoError(t, err)
	c := dial(t, p)
	_, err = c.Write(query("SELECT 1"))
	require.NoError(t, err)
	readOK(t, c)

	require.NoError(t, p.Close())
	readsEOF(t, c)
	srv.connectionEnds(t)
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.Error(t, err)
}

// The premise of the chaos tests: go-sql-driver sends (*sql.Tx).Commit as a
// COM_QUERY "COMMIT" that the proxy recognises, and each fault leaves the
// server in the state it is named for.
func TestFaultProxy_MariaDB_GoSQLDriverCommitIsLostAsArmed(t *testing.T) {
	t.Parallel()
	direct, dsn := testdb.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := direct.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY)")
	require.NoError(t, err)

	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	require.True(t, cfg.InterpolateParams)
	p := startProxy(t, cfg.Addr)
	cfg.Addr = p.Addr()
	proxied, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { proxied.Close() })

	for id, fault := range []faultproxy.Fault{faultproxy.ReplyLost, faultproxy.RequestLost, faultproxy.LateCommit} {
		tx, err := proxied.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES (?)", id)
		require.NoError(t, err)
		p.Arm(fault)
		require.Error(t, tx.Commit(), fault.String())
		require.Equal(t, fault, fired(t, p).Fault)

		// Inserting the same id again on the direct connection tells the
		// outcome: a duplicate if the COMMIT took effect; success (after
		// the server rolled the dead session back) if it did not.
		_, err = direct.ExecContext(ctx, "INSERT INTO t VALUES (?)", id)
		var me *mysql.MySQLError
		if fault != faultproxy.RequestLost {
			require.True(t, errors.As(err, &me) && me.Number == 1062, "the commit took effect: %v", err)
		} else {
			require.NoError(t, err, "the commit never reached the server")
		}
	}
	// The proxy still serves after its faults.
	require.NoError(t, proxied.PingContext(ctx))
}
