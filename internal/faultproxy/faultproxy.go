// Package faultproxy is a TCP proxy for tests that sits between a database
// client and server, MySQL (the default) or PostgreSQL, and can lose a
// COMMIT: either the server's reply to it (the commit happened, the client
// never hears so), or the request itself (the commit never reached the
// server), or the client's patience (the commit reaches the server only after
// the client's connection is gone). All end in a dropped connection, which is
// all a client sees in any case: together they are the "commit outcome
// unknown" problem.
//
// The proxy parses the framing of the client→server direction across
// arbitrary read boundaries; the server→client direction is copied unparsed.
// Messages that cannot be a COMMIT are streamed through without being
// buffered whole.
//
// MySQL: packets are a 3-byte little-endian payload length, a 1-byte sequence
// id and the payload. A COMMIT is a command packet (sequence id 0) whose
// payload is COM_QUERY (0x03) followed by the text COMMIT, case-insensitively,
// with optional surrounding whitespace and a trailing semicolon.
// go-sql-driver sends (*sql.Tx).Commit exactly so. TLS and protocol
// compression are not supported (the bytes would not be parseable); test DSNs
// must not enable them.
//
// PostgreSQL (WithProtocol(PostgreSQL)): the startup-phase messages have no
// type byte (SSLRequest, GSSENCRequest, CancelRequest, StartupMessage); every
// later message is a type byte, a big-endian int32 length and the payload. A
// COMMIT is either of:
//   - a simple-query message ('Q') whose text is COMMIT, matched as for
//     MySQL. pgx sends (*sql.Tx).Commit exactly so: its Tx.Commit executes
//     "commit", and pgx sends every statement without arguments by the
//     simple protocol.
//   - by the extended protocol, a Bind ('B') of a prepared statement whose
//     Parse ('P') on the same connection, in an earlier write or the same
//     one, had the text COMMIT, together with the Describe, Execute and
//     Flush messages after it, up to and including the next Sync ('S'). pgx
//     sends a "commit" queued in a Batch so (SendBatch in its default mode,
//     which prepares the statement once per connection): the statements
//     before it in the pipeline reach the server as usual, and only the
//     COMMIT's messages are held back. The proxy follows which statements
//     are COMMIT from the Parse and Close messages it forwards (see
//     pgFramer).
//
// TLS and GSSAPI encryption are not supported: once the server accepts an
// SSLRequest or GSSENCRequest, the proxy passes the connection through
// unparsed and its faults never fire on it. Test connections must therefore
// say sslmode=disable: pgx's default, prefer, encrypts whenever the server
// has TLS on.
//
// Beside the armed COMMIT faults, the proxy has a reset mode (reset.go):
// while it is on, every open connection is reset on both sides at random
// intervals, whatever it is doing, the way a flapping network or a failing
// load balancer ends them.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the proxy does to the next COMMIT once armed.
type Fault int

const (
	// None forwards everything.
	None Fault = iota

	// ReplyLost forwards the COMMIT to the server, waits ReplyDelay so that
	// the server commits, then closes both connections without forwarding
	// anything the server answered.
	ReplyLost

	// RequestLost drops the COMMIT and closes both connections: the server
	// sees a client that went away with an open transaction and rolls it
	// back.
	RequestLost

	// LateCommit cuts the client at once, then delivers the COMMIT to the
	// server ReplyDelay later, drops its reply and closes the server side
	// once the server has answered it (within ReplyWait): the client gives
	// up before the server has even begun to commit, and the commit lands
	// while the client's side is deciding what happened.
	LateCommit
)

func (f Fault) String() string {
	switch f {
	case None:
		return "none"
	case ReplyLost:
		return "reply-lost"
	case RequestLost:
		return "request-lost"
	case LateCommit:
		return "late-commit"
	}
	return "fault(?)"
}

// DefaultReplyDelay is how long ReplyLost waits, after forwarding the COMMIT,
// before it cuts the connection, and how late LateCommit delivers it.
const DefaultReplyDelay = 100 * time.Millisecond

// ReplyWait bounds how long ReplyLost and LateCommit keep the server side
// open after delivering the COMMIT, waiting for the server's answer to it.
// They close it only once the server has answered (and dropped the answer):
// closed earlier, on a loaded machine, the connection could end before the
// server read the COMMIT (a close with unread data is a reset, which
// discards it), and a reply lost would become a request lost.
const ReplyWait = 30 * time.Second

// maxCandidate is the largest payload that is inspected as a possible
// COMMIT; every larger message is streamed through without buffering.
const maxCandidate = 64

// Protocol is the wire protocol whose client→server messages the proxy
// parses to find a COMMIT.
type Protocol int

const (
	// MySQL is the MySQL client/server protocol, which MariaDB speaks too.
	MySQL Protocol = iota

	// PostgreSQL is the PostgreSQL frontend/backend protocol, version 3.
	PostgreSQL

	// Opaque is any other protocol (a message broker's): its bytes are
	// forwarded unparsed, so no COMMIT fault ever fires; the proxy cuts
	// and resets its connections only (Reset, StartResets, Close).
	Opaque
)

func (p Protocol) String() string {
	switch p {
	case MySQL:
		return "mysql"
	case PostgreSQL:
		return "postgresql"
	case Opaque:
		return "opaque"
	}
	return "protocol(?)"
}

// newFramer returns a framer for one connection, or nil for an unknown
// protocol.
func (p Protocol) newFramer() framer {
	switch p {
	case MySQL:
		return &mysqlFramer{}
	case PostgreSQL:
		return &pgFramer{}
	case Opaque:
		return opaqueFramer{}
	}
	return nil
}

// opaqueFramer forwards every byte at once and never finds a COMMIT.
type opaqueFramer struct{}

func (opaqueFramer) feed(b []byte) (out, commit []byte) { return b, nil }
func (opaqueFramer) statement([]byte) string            { return "" }

// framer splits one connection's client→server byte stream into the
// messages of a protocol and holds back a COMMIT.
type framer interface {
	// feed consumes b and returns the bytes to forward now and, if a COMMIT
	// message completed, that message (not included in out). When a COMMIT
	// is returned, bytes of b after it stay buffered: call feed(nil) to get
	// them.
	feed(b []byte) (out, commit []byte)

	// statement returns the statement text of a COMMIT message that feed
	// returned, before feed is called again.
	statement(commit []byte) string
}

// Firing reports one fault the proxy injected, once it is complete.
type Firing struct {
	Fault Fault
	Query string // the statement text it matched
}

// Proxy forwards TCP connections from a loopback listener to a target.
type Proxy struct {
	target     string
	protocol   Protocol
	ln         net.Listener
	replyDelay atomic.Int64 // a time.Duration

	armed  atomic.Int32 // a Fault, consumed by the first matching COMMIT
	fired  chan Firing
	closed chan struct{}

	mu    sync.Mutex
	conns map[*link]struct{}
	wg    sync.WaitGroup
	once  sync.Once

	resets resetMode
}

// Option configures a Proxy.
type Option func(*Proxy)

// WithProtocol sets the wire protocol the proxy parses. Defaults to MySQL.
func WithProtocol(p Protocol) Option { return func(px *Proxy) { px.protocol = p } }

// WithReplyDelay sets the reply delay (see SetReplyDelay).
func WithReplyDelay(d time.Duration) Option { return func(p *Proxy) { p.replyDelay.Store(int64(d)) } }

// SetReplyDelay changes how long ReplyLost waits before it cuts the
// connection (0 cuts it right after forwarding the COMMIT, racing the
// server's commit) and how late LateCommit delivers the COMMIT.
func (p *Proxy) SetReplyDelay(d time.Duration) { p.replyDelay.Store(int64(d)) }

// Start listens on 127.0.0.1:0 and forwards every accepted connection to
// target (host:port).
func Start(target string, opts ...Option) (*Proxy, error) {
	p := &Proxy{
		target: target,
		fired:  make(chan Firing, 64), closed: make(chan struct{}),
		conns: map[*link]struct{}{},
	}
	p.replyDelay.Store(int64(DefaultReplyDelay))
	for _, o := range opts {
		o(p)
	}
	if p.protocol.newFramer() == nil {
		return nil, errors.New("faultproxy: unknown protocol; use MySQL, PostgreSQL or Opaque")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm makes the next COMMIT on any connection suffer f. It fires once; Arm
// again for another. Arm(None) disarms.
func (p *Proxy) Arm(f Fault) { p.armed.Store(int32(f)) }

// Armed returns the fault still waiting for a COMMIT, or None.
func (p *Proxy) Armed() Fault { return Fault(p.armed.Load()) }

// Fired delivers one Firing per injected fault, after the connection has been
// cut. It buffers 64 firings; later ones are dropped if nobody reads.
func (p *Proxy) Fired() <-chan Firing { return p.fired }

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	var err error
	p.once.Do(func() {
		close(p.closed)
		p.StopResets()
		err = p.ln.Close()
		p.mu.Lock()
		for l := range p.conns {
			l.cut()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		l.cut()
		return
	default:
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()

	done := make(chan struct{})
	go func() {
		defer close(done)
		l.serverToClient()
	}()
	p.clientToServer(l)
	l.cut()
	<-done
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	muted          atomic.Bool // drop everything the server sends
	cutOnce        sync.Once

	replied   chan struct{} // closed when the server sends after awaitReply
	awaiting  atomic.Bool
	replyOnce sync.Once
}

// awaitReply returns a channel closed when the server next sends anything:
// its answer to what the caller writes next.
func (l *link) awaitReply() <-chan struct{} {
	l.replied = make(chan struct{})
	l.awaiting.Store(true) // publishes l.replied to serverToClient
	return l.replied
}

// cut closes both sides.
func (l *link) cut() {
	l.cutOnce.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

func (l *link) serverToClient() {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 && l.awaiting.Load() {
			l.replyOnce.Do(func() { close(l.replied) })
		}
		if n > 0 && !l.muted.Load() {
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	l.cut()
}

// clientToServer parses messages and forwards them until either side fails
// or a fault fires.
func (p *Proxy) clientToServer(l *link) {
	f := p.protocol.newFramer()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			out, commit := f.feed(buf[:n])
			for {
				if len(out) > 0 {
					if _, werr := l.server.Write(out); werr != nil {
						return
					}
				}
				if commit == nil {
					break
				}
				if fault := Fault(p.armed.Swap(int32(None))); fault != None {
					p.inject(l, fault, commit, f.statement(commit))
					return
				}
				if _, werr := l.server.Write(commit); werr != nil {
					return
				}
				out, commit = f.feed(nil) // what followed the COMMIT in this read
			}
		}
		if err != nil {
			return
		}
	}
}

// inject applies fault to the COMMIT message msg (header included), whose
// statement text is query.
func (p *Proxy) inject(l *link, fault Fault, msg []byte, query string) {
	delay := time.Duration(p.replyDelay.Load())
	switch fault {
	case ReplyLost:
		l.muted.Store(true) // before the server can answer
		replied := l.awaitReply()
		if _, err := l.server.Write(msg); err == nil && p.wait(replied) {
			p.sleep(delay)
		}
	case LateCommit:
		l.muted.Store(true)
		_ = l.client.Close()
		if p.sleep(delay) {
			replied := l.awaitReply()
			if _, err := l.server.Write(msg); err == nil {
				p.wait(replied)
			}
		}
	}
	l.cut()
	select {
	case p.fired <- Firing{Fault: fault, Query: query}:
	default:
	}
}

// wait waits, up to ReplyWait, until the server has answered (replied is
// closed); it reports false if the proxy closes or the server does not
// answer in time.
func (p *Proxy) wait(replied <-chan struct{}) bool {
	t := time.NewTimer(ReplyWait)
	defer t.Stop()
	select {
	case <-replied:
		return true
	case <-t.C:
		return false
	case <-p.closed:
		return false
	}
}

// sleep waits d, or less if the proxy closes; it reports whether it waited
// all of d.
func (p *Proxy) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.closed:
		return false
	}
}
