package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/orderguard/idempotency/queue"
)

// Crash points for the crash tests. With IDEMPOTENCY_CRASH_POINT set, the
// consumer SIGKILLs itself the first time a message reaches that point:
// no deferred function, no rollback, no ack, exactly like kill -9.
const (
	crashPointInHandler   = "in-handler"   // the order row is written, not committed
	crashPointAfterCommit = "after-commit" // order and record committed, the message not acked
)

// crashPoint reads and checks IDEMPOTENCY_CRASH_POINT.
func crashPoint() (string, error) {
	switch p := os.Getenv("IDEMPOTENCY_CRASH_POINT"); p {
	case "", crashPointInHandler, crashPointAfterCommit:
		return p, nil
	default:
		return "", fmt.Errorf("IDEMPOTENCY_CRASH_POINT=%q: want %s or %s", p, crashPointInHandler, crashPointAfterCommit)
	}
}

func die() {
	fmt.Fprintln(os.Stderr, "orderconsumer: crash point reached: SIGKILL")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Hour) // the signal is on its way
}

// crashInHandler dies inside the create's transaction, after its order
// row is written.
func crashInHandler(point string) func(context.Context) error {
	if point != crashPointInHandler {
		return nil
	}
	return func(context.Context) error { die(); return nil }
}

// crashAfterCommit dies once a message's run has committed, before the
// message is acked.
func crashAfterCommit(point string) func(queue.Settlement) {
	if point != crashPointAfterCommit {
		return nil
	}
	return func(s queue.Settlement) {
		if s.Decision == queue.Ack && !s.Answer.Replayed && s.Answer.Problem == nil && s.Answer.Status < 300 {
			die()
		}
	}
}
