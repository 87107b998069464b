package postgres

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Open's pool sizes itself by how its connections fare, much as TCP sizes
// its window: it halves when connections die and grows back while they
// live. Every connection costs PostgreSQL a server process, and when the
// network cuts the pool's connections (a flapping link, a failing load
// balancer) each one the pool holds is a process to start again, while the
// requests waiting for a connection each dial their own. On a server that
// starts processes slowly the pool then never refills between cuts
// (README, "PostgreSQL connections"). So when a connection dies, the
// pool's limit halves, down to minAdaptiveConns; after growEvery without
// another death it grows by one, after the next by two, then four, and so
// on (TCP's slow start after a loss), back to the pool's size. A pool
// whose connections live stays at its size.
const (
	// minAdaptiveConns is the least the limit falls to: a request in its
	// business transaction may need a second connection for its lease's
	// heartbeat or a lookup.
	minAdaptiveConns = 2
	// growEvery is how long the pool's connections must live for its
	// limit to grow: with cuts every second or more often it stays near
	// minAdaptiveConns, and once they stop it is back from 2 to 25 in
	// five seconds (+1, +2, +4, +8, +16).
	growEvery = time.Second
	// idleGrace is how long a connection may have sat idle and still
	// count when it is found dead.
	idleGrace = 2 * time.Second
)

// sizer is the pool adaptive sizes: a *sql.DB.
type sizer interface {
	Stats() sql.DBStats
	SetMaxOpenConns(n int)
	SetMaxIdleConns(n int)
}

// adaptive decides the limit of one pool. Connections report their deaths
// to it (died); its loop (run) applies the limit to the pool. The loop, not
// the reporting connection, calls the pool: database/sql may close a dead
// connection, which reports, from within SetMaxOpenConns.
type adaptive struct {
	now   func() time.Time
	after func(time.Duration) <-chan time.Time

	mu      sync.Mutex
	shrunk  time.Time // the last death that counted
	deaths  int       // deaths that counted since the loop last looked
	counted int       // deaths that counted, ever

	kick     chan struct{} // buffered: deaths > 0
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func newAdaptive() *adaptive {
	return &adaptive{
		now: time.Now, after: time.After,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// died reports that a connection born (connected) at born, whose socket
// last carried bytes at lastIO, was found dead: reset, ended by the
// server, or cut before its session was ready. One cut ends many
// connections at once and they are found one by one; only a connection
// born after the last death that counted counts, so a cut halves the
// limit once, as TCP halves its window once per lost window. A connection
// that sat idle for over idleGrace before it was found dead does not
// count: something reaped it while idle (idle_session_timeout, a NAT's or
// a load balancer's idle timeout), which says nothing of the network now.
func (a *adaptive) died(born, lastIO time.Time) {
	if a == nil {
		return
	}
	a.mu.Lock()
	now := a.now()
	counts := born.After(a.shrunk) && now.Sub(lastIO) <= idleGrace
	if counts {
		a.shrunk = now
		a.deaths++
		a.counted++
	}
	a.mu.Unlock()
	if counts {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

// run sizes db until close. db's MaxOpenConnections when run starts is the
// ceiling; a caller's own SetMaxOpenConns later is the new ceiling (0,
// unlimited, turns the sizing off until the caller sets a limit again).
// The idle limit follows the open limit.
func (a *adaptive) run(db sizer) {
	defer close(a.done)
	ceiling := db.Stats().MaxOpenConnections
	limit, set := ceiling, ceiling
	quiet := 0 // growth intervals since the last death
	var grow <-chan time.Time
	for {
		select {
		case <-a.stop:
			return
		case <-a.kick:
			if n := db.Stats().MaxOpenConnections; n != set { // the caller's
				ceiling, limit, set = n, n, n
			}
			a.mu.Lock()
			deaths := a.deaths
			a.deaths = 0
			a.mu.Unlock()
			for ; deaths > 0 && ceiling > 0; deaths-- {
				limit = max(min(minAdaptiveConns, ceiling), limit/2)
				quiet = 0
			}
		case <-grow:
			if n := db.Stats().MaxOpenConnections; n != set {
				ceiling, limit, set = n, n, n
			}
			quiet = min(quiet+1, 16)
			limit = min(ceiling, limit+1<<(quiet-1))
		}
		if limit != set {
			db.SetMaxOpenConns(limit)
			db.SetMaxIdleConns(limit)
			set = limit
		}
		grow = nil
		if limit < ceiling {
			grow = a.after(growEvery)
		}
	}
}

// close stops the loop; the pool keeps the limit it had.
func (a *adaptive) close() {
	if a == nil {
		return
	}
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.done
}

// watch makes dial's connections watched sockets.
func watch(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		w := &watched{Conn: c}
		w.lastIO.Store(time.Now().UnixNano())
		return w, nil
	}
}

// watched is a connection's socket that remembers how its session ended
// and when it last carried bytes. The network or the server ended it when
// the first failure a read or a write met was a reset, a broken pipe or
// the end of the stream, or the server's last word was a FATAL error that
// ends sessions (endedByServer). pgx also closes a connection whose
// statement's context ended: it sets a deadline, which its reads meet
// first, or sends Terminate and reads until the server closes the stream.
// That connection died of its request, not of the network, and must not
// shrink the pool: a client that hangs up is not a cut.
type watched struct {
	net.Conn
	verdict atomic.Int32 // 0 while the session lives, then how it ended
	lastIO  atomic.Int64 // when a read or a write last moved bytes, in Unix nanoseconds
}

const (
	endedByPeer      = 1 // the network or the server
	endedByThisSide  = 2 // a deadline, a close, a Terminate: pgx's doing
	terminateMessage = "X\x00\x00\x00\x04"
)

func (w *watched) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	w.see(n, err)
	return n, err
}

func (w *watched) Write(b []byte) (int, error) {
	if bytes.HasSuffix(b, []byte(terminateMessage)) {
		w.verdict.CompareAndSwap(0, endedByThisSide)
	}
	n, err := w.Conn.Write(b)
	w.see(n, err)
	return n, err
}

func (w *watched) see(n int, err error) {
	if n > 0 {
		w.lastIO.Store(time.Now().UnixNano())
	}
	switch {
	case err == nil:
	case cutBeforeSession(err):
		w.verdict.CompareAndSwap(0, endedByPeer)
	default:
		w.verdict.CompareAndSwap(0, endedByThisSide)
	}
}

// SyscallConn is the socket's, for peek.
func (w *watched) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := w.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// watchedSocket is c's watched socket, or nil for a pool Open did not make.
func watchedSocket(c net.Conn) *watched {
	w, _ := socket(c).(*watched)
	return w
}

// endedByServer marks the socket of a connection whose server ended its
// session with a FATAL error of class 57 (operator intervention: a
// shutdown, pg_terminate_backend, idle_session_timeout) or 08 (connection
// exception), before pgx closes it. Open installs it as the connection
// config's OnPgError, ahead of the caller's or pgx's own.
func endedByServer(next pgconn.PgErrorHandler) pgconn.PgErrorHandler {
	return func(pc *pgconn.PgConn, pe *pgconn.PgError) bool {
		fatal := strings.EqualFold(pe.Severity, "FATAL") || strings.EqualFold(pe.Severity, "PANIC")
		if fatal && (strings.HasPrefix(pe.Code, "57") || strings.HasPrefix(pe.Code, "08")) {
			if w := watchedSocket(pc.Conn()); w != nil {
				w.verdict.CompareAndSwap(0, endedByPeer)
			}
		}
		if next == nil {
			return !fatal
		}
		return next(pc, pe)
	}
}
