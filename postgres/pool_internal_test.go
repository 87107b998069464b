package postgres

// The specifications of Open's adaptive pool size, on a pool stand-in and
// an injected clock: the rule alone (pool_test.go has it on a real pool).

import (
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakePool records the limits given to it.
// looked is sent on each time the sizing reads the pool's limit: when its
// loop starts and when it takes up a death.
type fakePool struct {
	mu         sync.Mutex
	open, idle int
	sets       []int
	looked     chan struct{}
	set        chan int // each limit set, as it is set
}

func (p *fakePool) Stats() sql.DBStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case p.looked <- struct{}{}:
	default:
	}
	return sql.DBStats{MaxOpenConnections: p.open}
}

func (p *fakePool) SetMaxOpenConns(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = n
	p.sets = append(p.sets, n)
	p.set <- n
}

func (p *fakePool) SetMaxIdleConns(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idle = n
}

func (p *fakePool) limits() (sets []int, open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.sets...), p.open, p.idle
}

// SetByCaller is a caller's own SetMaxOpenConns: not recorded as the
// sizing's.
func (p *fakePool) SetByCaller(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = n
}

// sizing is an adaptive on a fakePool of size ceiling with a clock the test
// moves: each step of the loop that leaves the limit below the ceiling
// arms a growth timer, sent on armed, which the test fires.
type sizing struct {
	*adaptive
	pool  *fakePool
	clock time.Time
	armed chan chan time.Time
}

func newSizing(t *testing.T, ceiling int) *sizing {
	s := &sizing{adaptive: newAdaptive(), pool: &fakePool{open: ceiling, idle: ceiling, looked: make(chan struct{}, 64), set: make(chan int, 64)},
		clock: time.Unix(1_800_000_000, 0), armed: make(chan chan time.Time, 16)}
	s.now = func() time.Time { return s.clock }
	s.after = func(time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		s.armed <- c
		return c
	}
	go s.run(s.pool)
	t.Cleanup(s.close)
	return s
}

// tick moves the clock on, so that a connection born now is younger than
// the last death that counted.
func (s *sizing) tick() time.Time {
	s.clock = s.clock.Add(time.Millisecond)
	return s.clock
}

// step waits for the loop to finish a step that left the limit below the
// ceiling, and returns its growth timer.
func (s *sizing) step(t *testing.T) chan time.Time {
	t.Helper()
	select {
	case c := <-s.armed:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the sizing loop never finished its step")
		return nil
	}
}

// cut kills a connection made before it and waits for the loop's step;
// it returns the step's growth timer.
func (s *sizing) cut(t *testing.T) chan time.Time {
	t.Helper()
	born := s.tick()
	s.tick()
	s.died(born, s.clock)
	return s.step(t)
}

// quiet lets n growth intervals pass without a death, each a step of the
// loop's, and returns the last step's growth timer.
func (s *sizing) quiet(t *testing.T, grow chan time.Time, n int) chan time.Time {
	t.Helper()
	for range n {
		grow <- s.tick()
		grow = s.step(t)
	}
	return grow
}

// awaitSet waits until the loop sets the pool's limit to n.
func (s *sizing) awaitSet(n int) {
	for got := range s.pool.set {
		if got == n {
			return
		}
	}
}

func TestAdaptive_ADeathHalvesTheLimit_OncePerCut(t *testing.T) {
	s := newSizing(t, 25)

	born := s.tick() // connections made before the cut
	s.tick()
	s.died(born, s.clock) // the cut: the first of its dead found
	s.step(t)
	s.died(born, s.clock) // more of the same cut's dead, found later
	s.died(born, s.clock)
	later := s.tick() // a connection made after the cut...
	s.tick()
	s.died(later, s.clock) // ...dies in the next cut
	s.step(t)

	sets, open, idle := s.pool.limits()
	require.Equal(t, []int{12, 6}, sets,
		"each cut halves the limit once: the dead of a cut already counted (born before it) do not halve it again")
	require.Equal(t, 6, open)
	require.Equal(t, 6, idle, "the idle limit follows the open limit")
}

func TestAdaptive_NeverBelowTwo(t *testing.T) {
	s := newSizing(t, 25)
	for range 6 {
		s.cut(t)
	}
	sets, _, _ := s.pool.limits()
	require.Equal(t, []int{12, 6, 3, 2}, sets,
		"a request may need a second connection (heartbeat, lookup): the limit stops at minAdaptiveConns")
}

func TestAdaptive_GrowsByOneThenTwoThenFour_BackToTheCeiling(t *testing.T) {
	s := newSizing(t, 16)
	s.quiet(t, s.cut(t), 2)
	grow := s.quiet(t, s.cut(t), 3) // growth starts over at one after a death
	grow <- s.tick()
	s.awaitSet(16)
	s.close()
	require.Empty(t, s.armed, "a pool back at its ceiling arms no growth timer")
	sets, open, idle := s.pool.limits()
	require.Equal(t, []int{8, 9, 11, 5, 6, 8, 12, 16}, sets,
		"halved by a death; then, per growEvery without one, one more, two more, four more... up to the ceiling")
	require.Equal(t, 16, open)
	require.Equal(t, 16, idle, "the idle limit grows with it")
}

func TestAdaptive_TheCallersOwnLimit_IsTheNewCeiling(t *testing.T) {
	s := newSizing(t, 25)
	s.pool.SetByCaller(10)
	grow := s.quiet(t, s.cut(t), 2)
	grow <- s.tick()
	s.awaitSet(10)
	sets, _, _ := s.pool.limits()
	require.Equal(t, []int{5, 6, 8, 10}, sets, "halved from the caller's 10 and grown back to it, not to 25")
}

func TestAdaptive_ACallersUnlimitedPool_IsLeftAlone(t *testing.T) {
	s := newSizing(t, 25)
	<-s.pool.looked // the loop started
	s.pool.SetByCaller(0)
	born := s.tick()
	s.tick()
	s.died(born, s.clock)
	<-s.pool.looked // the loop took the death up
	s.close()       // and finished with it
	sets, open, _ := s.pool.limits()
	require.Empty(t, sets, "a pool the caller made unlimited (0) is not sized")
	require.Zero(t, open)
}

func TestAdaptive_AConnectionReapedWhileIdle_DoesNotCount(t *testing.T) {
	s := newSizing(t, 25)
	<-s.pool.looked // the loop started
	born := s.tick()
	s.clock = s.clock.Add(idleGrace + time.Second)
	s.died(born, born) // idle since it was made: idle_session_timeout, a NAT's timeout
	require.Zero(t, s.counted, "a connection found dead after sitting idle longer than idleGrace does not count")

	born = s.tick()
	s.tick()
	s.died(born, s.clock) // in use just now
	s.step(t)
	sets, _, _ := s.pool.limits()
	require.Equal(t, []int{12}, sets, "one in use when it died counts")
}
