package faultproxy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/faultproxy"
)

// The PostgreSQL frontend protocol through the proxy, against a fake server.

// Codes of the startup-phase messages.
const (
	pgProtocol3     = 3 << 16
	pgCancel        = 80877102
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
)

// pgUntyped frames a startup-phase message: int32 length (itself included),
// int32 code, rest.
func pgUntyped(code uint32, rest []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(rest)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, rest...)
}

// pgStartup is a StartupMessage with the given parameters, as name, value
// pairs.
func pgStartup(params ...string) []byte {
	var rest []byte
	for _, p := range params {
		rest = append(append(rest, p...), 0)
	}
	return pgUntyped(pgProtocol3, append(rest, 0))
}

var pgSSL = pgUntyped(pgSSLRequest, nil)

// pgMessage frames a typed message: type byte, int32 length (itself
// included), payload.
func pgMessage(typ byte, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{typ}, uint32(4+len(payload)))
	return append(b, payload...)
}

// pgQuery is a simple-query message.
func pgQuery(q string) []byte { return pgMessage('Q', append([]byte(q), 0)) }

// The extended protocol's messages, as pgx sends them.

// pgParse prepares query as statement name, with no parameter types.
func pgParse(name, query string) []byte {
	payload := append(append([]byte(name), 0), query...)
	return pgMessage('P', append(payload, 0, 0, 0))
}

// pgDescribeStatement asks for a statement's parameters and columns.
func pgDescribeStatement(name string) []byte { return pgMessage('D', append([]byte("S"+name), 0)) }

// pgBind binds statement name to the unnamed portal with params in text
// format.
func pgBind(name string, params ...string) []byte {
	payload := append([]byte("\x00"+name+"\x00"), 0, 0) // portal "", statement, no format codes
	payload = binary.BigEndian.AppendUint16(payload, uint16(len(params)))
	for _, p := range params {
		payload = append(binary.BigEndian.AppendUint32(payload, uint32(len(p))), p...)
	}
	return pgMessage('B', append(payload, 0, 0)) // no result format codes
}

var (
	pgDescribePortal = pgMessage('D', []byte("P\x00"))                // the unnamed portal's columns
	pgExecute        = pgMessage('E', []byte("\x00\x00\x00\x00\x00")) // the unnamed portal, all rows
	pgSync           = pgMessage('S', nil)
)

// pgxStatementName is the name under which pgx's statement cache prepares
// sql: 58 bytes, which makes its Parse and Bind longer than a simple-query
// COMMIT.
func pgxStatementName(sql string) string {
	digest := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(digest[:24])
}

// pgReady is what the fake server answers to every message after the
// startup: ReadyForQuery, idle.
var pgReady = pgMessage('Z', []byte{'I'})

// pgReceived is one message the fake server read: typ is 0 for a
// startup-phase message, whose payload then starts with the code.
type pgReceived struct {
	typ     byte
	payload []byte
}

// fakePostgres reads PostgreSQL frontend messages. It refuses encryption
// ('N'), answers every later message with ReadyForQuery and ends a
// connection after a CancelRequest, as a server does. It reports every
// message it receives and every connection that ends.
type fakePostgres struct {
	ln       net.Listener
	received chan pgReceived
	ended    chan error
}

func newFakePostgres(t *testing.T) *fakePostgres {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &fakePostgres{ln: ln, received: make(chan pgReceived, 1024), ended: make(chan error, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				var end error
				defer func() { c.Close(); s.ended <- end }()
				end = s.serve(c)
			})
		}
	})
	return s
}

func (s *fakePostgres) serve(c net.Conn) error {
	typed := false
	for {
		var typ byte
		if typed {
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil {
				return err
			}
			typ = b[0]
		}
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return err
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr)-4)
		if _, err := io.ReadFull(c, payload); err != nil {
			return err
		}
		s.received <- pgReceived{typ, payload}
		answer := pgReady
		if !typed {
			switch binary.BigEndian.Uint32(payload) {
			case pgSSLRequest, pgGSSENCRequest:
				answer = []byte{'N'}
			case pgCancel:
				return nil
			default:
				typed = true
			}
		}
		if _, err := c.Write(answer); err != nil {
			return err
		}
	}
}

func (s *fakePostgres) addr() string { return s.ln.Addr().String() }

// next returns the next message the server received.
func (s *fakePostgres) next(t *testing.T) pgReceived {
	t.Helper()
	select {
	case m := <-s.received:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("the server received nothing")
		return pgReceived{}
	}
}

// receivesNothing asserts that no message arrives for a while.
func (s *fakePostgres) receivesNothing(t *testing.T) {
	t.Helper()
	select {
	case m := <-s.received:
		t.Fatalf("the server received %c %q", m.typ, m.payload)
	case <-time.After(200 * time.Millisecond):
	}
}

// receivedSoFar returns the messages the server received that next has not
// returned. Once a connection has ended, they include all it received.
func (s *fakePostgres) receivedSoFar() []pgReceived {
	var got []pgReceived
	for {
		select {
		case m := <-s.received:
			got = append(got, m)
		default:
			return got
		}
	}
}

func (s *fakePostgres) connectionEnds(t *testing.T) {
	t.Helper()
	select {
	case <-s.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's connection stayed open")
	}
}

func startPostgresProxy(t *testing.T, target string, opts ...faultproxy.Option) *faultproxy.Proxy {
	t.Helper()
	return startProxy(t, target, append([]faultproxy.Option{faultproxy.WithProtocol(faultproxy.PostgreSQL)}, opts...)...)
}

func readN(t *testing.T, c net.Conn, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// connect opens a proxied connection and starts it as pgx does: with an
// SSLRequest the server refuses when sslRequest is set (sslmode=prefer on a
// server without TLS), else with the StartupMessage alone (sslmode=disable).
func connect(t *testing.T, srv *fakePostgres, p *faultproxy.Proxy, sslRequest bool) net.Conn {
	t.Helper()
	c := dial(t, p)
	if sslRequest {
		writeSplit(t, c, pgSSL, 3)
		require.Equal(t, pgReceived{0, pgSSL[4:]}, srv.next(t))
		readN(t, c, []byte{'N'})
	}
	startup := pgStartup("user", "postgres", "database", "commit")
	writeSplit(t, c, startup, 3)
	require.Equal(t, pgReceived{0, startup[4:]}, srv.next(t))
	readN(t, c, pgReady)
	return c
}

func TestFaultProxy_Postgres_Unarmed_ForwardsEveryMessageIntactWhateverTheReadBoundaries(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	c := dial(t, p)

	big := bytes.Repeat([]byte("x"), 300<<10) // streamed, never buffered whole
	messages := [][]byte{
		pgQuery("SELECT 1"),
		pgQuery("commit"), // unarmed: passes
		pgQuery("INSERT INTO t VALUES ('" + string(big) + "')"),
		pgMessage('P', []byte("\x00SELECT $1\x00\x00\x00")), // the extended protocol
		pgMessage('B', []byte("\x00\x00\x00\x00\x00\x01\x00\x00\x00\x011\x00\x00")),
		pgMessage('E', []byte("\x00\x00\x00\x00\x00")),
		pgMessage('S', nil),
		pgMessage('d', big), // CopyData
		pgQuery("COMMIT"),
	}
	// The startup, with a refused SSLRequest, and the first messages byte
	// by byte; the big ones in large pieces.
	stream := append(append([]byte(nil), pgSSL...), pgStartup("user", "postgres")...)
	for _, m := range messages {
		stream = append(stream, m...)
	}
	writeSplit(t, c, stream[:80], 3)
	writeSplit(t, c, stream[80:], 64<<10)

	require.Equal(t, pgReceived{0, pgSSL[4:]}, srv.next(t))
	require.Equal(t, pgReceived{0, pgStartup("user", "postgres")[4:]}, srv.next(t))
	for _, m := range messages {
		require.Equal(t, pgReceived{m[0], m[5:]}, srv.next(t))
	}
	readN(t, c, []byte{'N'})
	for range 1 + len(messages) {
		readN(t, c, pgReady)
	}
	require.Len(t, p.Fired(), 0)
}

func TestFaultProxy_Postgres_ReplyLost_ForwardsTheCommitThenCutsBothSidesWithoutItsReply(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	const delay = 150 * time.Millisecond
	p := startPostgresProxy(t, srv.addr(), faultproxy.WithReplyDelay(delay))
	c := connect(t, srv, p, false)

	_, err := c.Write(pgQuery("SELECT 1"))
	require.NoError(t, err)
	require.Equal(t, pgReceived{'Q', []byte("SELECT 1\x00")}, srv.next(t))
	readN(t, c, pgReady)

	p.Arm(faultproxy.ReplyLost)
	start := time.Now()
	writeSplit(t, c, pgQuery(" Commit;\n"), 2) // split header, any case, trimmed

	require.Equal(t, pgReceived{'Q', []byte(" Commit;\n\x00")}, srv.next(t), "the server got the COMMIT")
	readsEOF(t, c) // and the client never got the server's ReadyForQuery
	require.GreaterOrEqual(t, time.Since(start), delay, "the server had time to commit")
	srv.connectionEnds(t)
	f := fired(t, p)
	require.Equal(t, faultproxy.ReplyLost, f.Fault)
	require.Equal(t, " Commit;\n", f.Query)
	require.Equal(t, faultproxy.None, p.Armed(), "a fault fires once")
}

func TestFaultProxy_Postgres_RequestLost_DropsTheCommitAndWhatFollowsAndCutsBothSides(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	c := connect(t, srv, p, true)
	p.Arm(faultproxy.RequestLost)

	// One write: the statement before the COMMIT goes through, the COMMIT
	// and everything after it never reach the server.
	var b []byte
	b = append(b, pgQuery("UPDATE t SET a = 1")...)
	b = append(b, pgQuery("COMMIT")...)
	b = append(b, pgQuery("SELECT 2")...)
	_, err := c.Write(b)
	require.NoError(t, err)

	require.Equal(t, pgReceived{'Q', []byte("UPDATE t SET a = 1\x00")}, srv.next(t))
	srv.connectionEnds(t)
	srv.receivesNothing(t)
	// The client may or may not have received the UPDATE's answer before
	// the cut; it never receives anything after it.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c)
	require.True(t, err == nil || !isTimeout(err), "the connection stayed open: %v", err)
	require.True(t, len(rest) == 0 || bytes.Equal(rest, pgReady), "got %q", rest)
	f := fired(t, p)
	require.Equal(t, faultproxy.RequestLost, f.Fault)
	require.Equal(t, "COMMIT", f.Query)
}

// pgxBatch is the postgres store's last write as pgx sends it with
// SendBatch{INSERT, "commit"} in its default mode: prepare, the pipeline
// that prepares both statements, once per connection; then, in one write,
// each statement's Bind, Describe and Execute, and one Sync.
type pgxBatch struct {
	insert, commit string // statement names
	prepare        [][]byte
	insertPart     [][]byte
	commitPart     [][]byte
}

func newPgxBatch(insertSQL string, id int) pgxBatch {
	b := pgxBatch{insert: pgxStatementName(insertSQL), commit: pgxStatementName("commit")}
	b.prepare = [][]byte{
		pgParse(b.insert, insertSQL), pgDescribeStatement(b.insert),
		pgParse(b.commit, "commit"), pgDescribeStatement(b.commit),
		pgSync,
	}
	b.insertPart = [][]byte{pgBind(b.insert, strconv.Itoa(id)), pgDescribePortal, pgExecute}
	b.commitPart = [][]byte{pgBind(b.commit), pgDescribePortal, pgExecute, pgSync}
	return b
}

// batch is the write that sends the INSERT and the COMMIT.
func (b pgxBatch) batch() []byte { return bytes.Join(append(b.insertPart, b.commitPart...), nil) }

// prepared sends the batch's prepare pipeline and waits for the answers.
func (b pgxBatch) prepared(t *testing.T, srv *fakePostgres, c net.Conn) {
	t.Helper()
	writeSplit(t, c, bytes.Join(b.prepare, nil), 16)
	for _, m := range b.prepare {
		require.Equal(t, pgReceived{m[0], m[5:]}, srv.next(t))
		readN(t, c, pgReady)
	}
}

// readsAtMostAnswersTo asserts that the client's connection is cut after
// it received at most the fake server's answers to n messages.
func readsAtMostAnswersTo(t *testing.T, c net.Conn, n int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c)
	require.True(t, err == nil || !isTimeout(err), "the connection stayed open: %v", err)
	require.LessOrEqual(t, len(rest), n*len(pgReady), "got %q", rest)
	require.Equal(t, bytes.Repeat(pgReady, len(rest)/len(pgReady)), rest)
}

func TestFaultProxy_Postgres_RequestLost_PipelinedCommit_TheInsertBeforeItReachesTheServerTheCommitNever(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	c := connect(t, srv, p, false)
	b := newPgxBatch("INSERT INTO t VALUES ($1)", 1)
	b.prepared(t, srv, c) // a Parse of COMMIT is no COMMIT

	p.Arm(faultproxy.RequestLost)
	_, err := c.Write(b.batch())
	require.NoError(t, err)

	// The fake server stops reading when it cannot answer, which may be
	// before the last of the INSERT's messages: it gets a part of them, and
	// nothing of the COMMIT.
	srv.connectionEnds(t)
	got := srv.receivedSoFar()
	require.NotEmpty(t, got)
	require.LessOrEqual(t, len(got), len(b.insertPart))
	for i, m := range got {
		require.Equal(t, pgReceived{b.insertPart[i][0], b.insertPart[i][5:]}, m, "the INSERT's messages go through")
	}
	readsAtMostAnswersTo(t, c, len(b.insertPart))
	f := fired(t, p)
	require.Equal(t, faultproxy.RequestLost, f.Fault)
	require.Equal(t, "commit", f.Query, "the COMMIT statement's text")
}

func TestFaultProxy_Postgres_ReplyLost_PipelinedCommit_ForwardsItThroughTheSyncThenCutsBothSides(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	const delay = 150 * time.Millisecond
	p := startPostgresProxy(t, srv.addr(), faultproxy.WithReplyDelay(delay))
	c := connect(t, srv, p, true)
	b := newPgxBatch("INSERT INTO t VALUES ($1)", 1)
	b.prepared(t, srv, c)

	p.Arm(faultproxy.ReplyLost)
	start := time.Now()
	writeSplit(t, c, b.batch(), 9) // the COMMIT is held across reads until its Sync

	for _, m := range append(b.insertPart, b.commitPart...) {
		require.Equal(t, pgReceived{m[0], m[5:]}, srv.next(t), "the server got the INSERT and the COMMIT")
	}
	readsAtMostAnswersTo(t, c, len(b.insertPart)) // never an answer to the COMMIT
	require.GreaterOrEqual(t, time.Since(start), delay, "the server had time to commit")
	srv.connectionEnds(t)
	f := fired(t, p)
	require.Equal(t, faultproxy.ReplyLost, f.Fault)
	require.Equal(t, "commit", f.Query)
}

func TestFaultProxy_Postgres_Armed_DoesNotFireOnAPipelineWithoutACommitStatement(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	c := connect(t, srv, p, false)
	b := newPgxBatch("INSERT INTO t VALUES ($1)", 1)
	b.prepared(t, srv, c)
	p.Arm(faultproxy.RequestLost)

	// The COMMIT statement closed (as pgx deallocates a statement it evicts
	// from its cache), then the name bound as another statement would be;
	// and the INSERT alone, with its Sync.
	closeCommit := pgMessage('C', append([]byte("S"+b.commit), 0))
	messages := [][]byte{closeCommit, pgSync, pgParse(b.commit, "SELECT 1"), pgSync}
	messages = append(messages, b.commitPart...)
	messages = append(messages, b.insertPart...)
	messages = append(messages, pgSync)
	writeSplit(t, c, bytes.Join(messages, nil), 16)
	for _, m := range messages {
		require.Equal(t, pgReceived{m[0], m[5:]}, srv.next(t))
		readN(t, c, pgReady)
	}
	require.Equal(t, faultproxy.RequestLost, p.Armed(), "nothing fired")
	require.Len(t, p.Fired(), 0)
}

func TestFaultProxy_Postgres_Armed_FiresOnlyOnASimpleQueryCommitAndOnlyOnce(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	p.Arm(faultproxy.RequestLost)
	c := connect(t, srv, p, true) // its startup names a database "commit"

	notCommits := [][]byte{
		pgQuery("SELECT 'COMMIT'"),
		pgQuery("COMMITTED"),
		pgQuery("ROLLBACK"),
		pgQuery("COMMIT; SELECT 1"),
		pgMessage('Q', []byte("COMMIT")),                 // no terminating NUL
		pgMessage('P', []byte("\x00COMMIT\x00\x00\x00")), // the extended protocol: Parse
		pgMessage('d', []byte("COMMIT\x00")),             // CopyData
		pgMessage('Q', []byte("\x00")),                   // an empty query
	}
	for _, m := range notCommits {
		writeSplit(t, c, m, 4)
		require.Equal(t, pgReceived{m[0], m[5:]}, srv.next(t))
		readN(t, c, pgReady)
	}
	require.Equal(t, faultproxy.RequestLost, p.Armed())

	// The first COMMIT, on another connection, fires.
	c2 := connect(t, srv, p, false)
	_, err := c2.Write(pgQuery("commit"))
	require.NoError(t, err)
	readsEOF(t, c2)
	require.Equal(t, faultproxy.RequestLost, fired(t, p).Fault)
	srv.connectionEnds(t)

	// The next COMMIT passes: the fault was consumed.
	_, err = c.Write(pgQuery("COMMIT"))
	require.NoError(t, err)
	require.Equal(t, pgReceived{'Q', []byte("COMMIT\x00")}, srv.next(t))
	readN(t, c, pgReady)
}

func TestFaultProxy_Postgres_CancelRequest_IsForwardedIntact(t *testing.T) {
	t.Parallel()
	srv := newFakePostgres(t)
	p := startPostgresProxy(t, srv.addr())
	p.Arm(faultproxy.RequestLost)
	c := dial(t, p)

	cancel := pgUntyped(pgCancel, []byte{0, 0, 0x30, 0x39, 0xde, 0xad, 0xbe, 0xef}) // process id, secret key
	writeSplit(t, c, cancel, 3)
	require.Equal(t, pgReceived{0, cancel[4:]}, srv.next(t))
	srv.connectionEnds(t)
	readsEOF(t, c)
	require.Equal(t, faultproxy.RequestLost, p.Armed())
}

// rawServer records every byte it receives.
type rawServer struct {
	ln    net.Listener
	bytes chan []byte
}

func newRawServer(t *testing.T) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &rawServer{ln: ln, bytes: make(chan []byte, 1024)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				for {
					buf := make([]byte, 32<<10)
					n, err := c.Read(buf)
					if n > 0 {
						s.bytes <- buf[:n]
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return s
}

// receives asserts that the server receives exactly want.
func (s *rawServer) receives(t *testing.T, want []byte) {
	t.Helper()
	var got []byte
	for len(got) < len(want) {
		select {
		case b := <-s.bytes:
			got = append(got, b...)
		case <-time.After(5 * time.Second):
			t.Fatalf("the server received %d of %d bytes", len(got), len(want))
		}
	}
	require.Equal(t, want, got)
}

// A stream that is not the plain protocol, encrypted or malformed, passes
// through unparsed: the proxy can neither see a COMMIT in it nor must it
// hold any byte back.
func TestFaultProxy_Postgres_EncryptedOrMalformedStream_PassesThroughUnparsedAndNeverFires(t *testing.T) {
	t.Parallel()
	// The start of a TLS ClientHello record.
	clientHello := append([]byte{0x16, 0x03, 0x01, 0x00, 0xf8, 0x01, 0x00, 0x00, 0xf4, 0x03, 0x03}, bytes.Repeat([]byte{0xab}, 40)...)
	// A GSSAPI token, length-prefixed as in GSSAPI encryption.
	gssToken := append(binary.BigEndian.AppendUint32(nil, 40), append([]byte{0x60, 0x82, 0x02, 0x5a}, bytes.Repeat([]byte{0xcd}, 36)...)...)
	tests := map[string][]byte{
		"TLS after an accepted SSLRequest":                  append(append([]byte(nil), pgSSL...), clientHello...),
		"GSSAPI encryption after an accepted GSSENCRequest": append(pgUntyped(pgGSSENCRequest, nil), gssToken...),
		"direct TLS (sslnegotiation=direct)":                clientHello,
		"an unknown protocol version":                       pgUntyped(2<<16, []byte("user\x00postgres\x00\x00")),
		"a startup message longer than PostgreSQL allows":   pgUntyped(pgProtocol3, bytes.Repeat([]byte("x"), 10000)),
		"a typed message whose length is less than its own": append(pgStartup("user", "postgres"), 'Q', 0, 0, 0, 2),
	}
	for name, start := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newRawServer(t)
			p := startPostgresProxy(t, srv.ln.Addr().String())
			p.Arm(faultproxy.RequestLost)
			c := dial(t, p)

			// What follows would be two COMMITs in the plain protocol: a
			// simple query and a Bind of a statement prepared as COMMIT.
			stream := bytes.Join([][]byte{start, pgStartup("user", "postgres"), pgQuery("COMMIT"),
				pgParse("c", "commit"), pgSync, pgBind("c"), pgExecute, pgSync}, nil)
			writeSplit(t, c, stream, 7)
			srv.receives(t, stream)
			require.Equal(t, faultproxy.RequestLost, p.Armed(), "nothing fired")
			require.Len(t, p.Fired(), 0)
		})
	}
}

func TestFaultProxy_Start_RefusesAnUnknownProtocol(t *testing.T) {
	t.Parallel()
	p, err := faultproxy.Start("127.0.0.1:1", faultproxy.WithProtocol(faultproxy.Protocol(7)))
	require.Error(t, err)
	require.Nil(t, p)
}
