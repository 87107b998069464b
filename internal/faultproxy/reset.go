package faultproxy

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ResetStats counts what the reset mode has done since the proxy started. A
// round is counted once all its resets are done, so its peers may see the
// reset a moment before the count does.
type ResetStats struct {
	Rounds int64 // times the proxy reset every open connection
	Links  int64 // proxied connections it reset, each on both sides
}

// resetMode is the state of the reset mode: the running loop, if any, and
// its counts.
type resetMode struct {
	mu   sync.Mutex    // serialises StartResets and StopResets
	stop chan struct{} // closed to end the running loop; nil when off
	done chan struct{} // closed when the running loop has ended

	rounds atomic.Int64
	links  atomic.Int64
}

// StartResets switches the reset mode on: the proxy waits an interval drawn
// uniformly from [lo, hi], afresh each time, then resets every open proxied
// connection on both sides, and so on until StopResets or Close. A reset
// sets SO_LINGER to 0 before closing, so each peer gets a TCP RST (ECONNRESET
// on its next read or write) rather than an orderly FIN: the client cannot
// tell whether its last statement ran, and the server aborts the session,
// rolling back any open transaction. The listener keeps accepting, so new
// connections are proxied and reset in their turn. Called while resets run,
// it changes the range.
func (p *Proxy) StartResets(lo, hi time.Duration) error {
	if lo <= 0 || hi < lo {
		return errors.New("faultproxy: the reset interval needs 0 < lo <= hi")
	}
	r := &p.resets
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-p.closed:
		return errors.New("faultproxy: the proxy is closed")
	default:
	}
	p.stopResetsLocked()
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	go p.resetLoop(lo, hi, r.stop, r.done)
	return nil
}

// StopResets switches the reset mode off. When it returns, no further reset
// happens: connections that are open or opened later live until a peer, an
// armed fault or Close ends them. It does nothing if resets are off.
func (p *Proxy) StopResets() {
	p.resets.mu.Lock()
	defer p.resets.mu.Unlock()
	p.stopResetsLocked()
}

func (p *Proxy) stopResetsLocked() {
	r := &p.resets
	if r.stop == nil {
		return
	}
	close(r.stop)
	<-r.done
	r.stop, r.done = nil, nil
}

// ResetStats returns the reset mode's counts so far.
func (p *Proxy) ResetStats() ResetStats {
	return ResetStats{Rounds: p.resets.rounds.Load(), Links: p.resets.links.Load()}
}

func (p *Proxy) resetLoop(lo, hi time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTimer(resetInterval(lo, hi, rand.N[time.Duration]))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-p.closed:
			return
		case <-t.C:
		}
		p.resets.links.Add(int64(p.resetAll()))
		p.resets.rounds.Add(1)
		t.Reset(resetInterval(lo, hi, rand.N[time.Duration]))
	}
}

// resetInterval draws from [lo, hi]; n(k) returns a uniform value in [0, k).
func resetInterval(lo, hi time.Duration, n func(time.Duration) time.Duration) time.Duration {
	return lo + n(hi-lo+1)
}

// Reset resets every open proxied connection now, on both sides, as one
// round of the reset mode does, and returns how many it ended. The
// listener keeps accepting: a peer that dials again is proxied anew.
func (p *Proxy) Reset() int {
	n := p.resetAll()
	p.resets.rounds.Add(1)
	p.resets.links.Add(int64(n))
	return n
}

// resetAll resets every open link and returns how many it ended.
func (p *Proxy) resetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.conns {
		if l.reset() {
			n++
		}
	}
	return n
}

// reset ends both sides with a TCP RST, unless the link has already been
// cut; it reports whether it ended the link.
func (l *link) reset() bool {
	ended := false
	l.cutOnce.Do(func() {
		abort(l.client)
		abort(l.server)
		ended = true
	})
	return ended
}

// abort closes c so that its peer receives an RST: with SO_LINGER at 0 the
// kernel discards unsent data and resets the connection instead of sending
// a FIN. Connections that are not TCP are merely closed.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
