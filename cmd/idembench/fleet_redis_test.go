package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
)

// A stopped proxy refuses new connections and cuts the open ones, as a
// stopped Redis would.
func TestProxy_StopRefusesNewConnectionsAndCutsOpenOnes(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					_, _ = c.Write(buf[:n])
				}
			}()
		}
	}()
	p, err := startProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("through the proxy: %q, %v", line, err)
	}

	p.stop()
	_, _ = c.Write([]byte("ping\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("an open connection answered %q after stop", line)
	}
	if c2, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		c2.Close()
		t.Fatal("a new connection was accepted after stop")
	}
	p.stop() // twice is fine
}

// Answers are filed before or after the cut by when they came; answers
// outside the window only count as answers (and errors, if they failed).
func TestCutClock_FilesAnswersByTheCut(t *testing.T) {
	now := time.Now()
	cc := &cutClock{winStart: now.Add(-time.Hour), winEnd: now.Add(time.Hour), sent: make([]time.Time, 1)}
	tg := cc.wrap(target{gen: genNewKey})
	w := newWorker(0)

	rq := tg.gen(w)
	tg.done(w, rq, 201, nil)
	cc.cut.Store(time.Now().UnixNano())
	rq = tg.gen(w)
	tg.done(w, rq, 201, nil)
	rq = tg.gen(w)
	tg.done(w, rq, 500, errors.New("status 500"))

	if len(cc.before) != 1 || len(cc.after) != 1 || cc.answers != 3 || cc.errors != 1 || cc.firstErr == "" {
		t.Fatalf("before %d, after %d, answers %d, errors %d (%q); want 1, 1, 3, 1",
			len(cc.before), len(cc.after), cc.answers, cc.errors, cc.firstErr)
	}
}

type fakeShared struct {
	idempotency.SharedCache
	rec *idempotency.Record
}

func (f fakeShared) MarkUnlessReplay(context.Context, idempotency.InFlightMarker, time.Duration) (*idempotency.Record, time.Duration, *idempotency.InFlightMarker, bool) {
	return f.rec, time.Minute, nil, f.rec == nil
}

// A replay whose MarkUnlessReplay (the middleware's one call before the
// database) found an entry and that executed nothing is counted as
// answered from Redis; one whose call missed, from the store.
func TestReplaySources_CountsSharedCacheHits(t *testing.T) {
	src := &replaySources{}
	replay := idempotency.Event{Final: true, Outcome: idempotency.OutcomeReplayed, Route: "create_order", From: idempotency.ReplayFromStore}
	for _, rec := range []*idempotency.Record{{Key: "k"}, nil} {
		ctx, _ := src.StartStage(context.Background(), idempotency.StageRequest, "create_order")
		sharedCounter{fakeShared{rec: rec}}.MarkUnlessReplay(ctx, idempotency.InFlightMarker{}, time.Minute)
		src.Observe(ctx, replay)
	}
	if src.shared.Load() != 1 || src.store.Load() != 1 {
		t.Fatalf("shared %d, store %d; want 1 and 1", src.shared.Load(), src.store.Load())
	}
}
