package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/orderguard/idempotency"
)

// Crash points for the crash-safety tests. With IDEMPOTENCY_CRASH_POINT set,
// the server SIGKILLs itself the first time a request reaches that point:
// no deferred function, no rollback, no goodbye, exactly like kill -9.
const (
	crashAfterClaim     = "after-claim"     // the PROCESSING claim is committed
	crashInHandler      = "in-handler"      // the order row is written, not committed
	crashDuringFinalize = "during-finalize" // the record is finished inside the uncommitted transaction
	crashAfterCommit    = "after-commit"    // effect and snapshot committed, success answer (201, a callback's 2xx) not written
	crashDuringRelease  = "during-release"  // the handler failed; the claim is about to be released
)

var crashPoints = []string{crashAfterClaim, crashInHandler, crashDuringFinalize, crashAfterCommit, crashDuringRelease}

// crashPoint reads and checks IDEMPOTENCY_CRASH_POINT.
func crashPoint() (string, error) {
	p := os.Getenv("IDEMPOTENCY_CRASH_POINT")
	if p == "" {
		return "", nil
	}
	for _, known := range crashPoints {
		if p == known {
			return p, nil
		}
	}
	return "", fmt.Errorf("IDEMPOTENCY_CRASH_POINT=%q: want one of %v", p, crashPoints)
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Hour) // the signal is on its way
}

// crashingStore dies at the store-side crash points.
type crashingStore struct {
	idempotency.Store
	point string
}

// BeginTxOptions passes Config.TxOptions (the payment events' isolation)
// to the store, which takes them (orderservice sets them only then).
func (s crashingStore) BeginTxOptions(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if b, ok := s.Store.(idempotency.TxOptionsBeginner); ok {
		return b.BeginTxOptions(ctx, opts)
	}
	return s.Store.BeginTx(ctx)
}

func (s crashingStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	l, err := s.Store.Claim(ctx, c)
	if err == nil && s.point == crashAfterClaim {
		die()
	}
	return l, err
}

func (s crashingStore) TakeOver(ctx context.Context, c idempotency.Claim, from idempotency.Lease) (idempotency.Lease, error) {
	l, err := s.Store.TakeOver(ctx, c, from)
	if err == nil && s.point == crashAfterClaim {
		die()
	}
	return l, err
}

func (s crashingStore) FinishTx(ctx context.Context, tx *sql.Tx, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	l, err := s.Store.FinishTx(ctx, tx, l, st, snap, retention)
	if err == nil && s.point == crashDuringFinalize {
		die()
	}
	return l, err
}

func (s crashingStore) InsertFinal(ctx context.Context, tx *sql.Tx, c idempotency.Claim, st idempotency.Status, snap *idempotency.Snapshot) error {
	err := s.Store.InsertFinal(ctx, tx, c, st, snap)
	if err == nil && tx != nil && s.point == crashDuringFinalize {
		die()
	}
	return err
}

// SingleWriter passes the wrapped store's answer through (see
// idempotency.Dialect.SingleWriter).
func (s crashingStore) SingleWriter() bool {
	sw, ok := s.Store.(interface{ SingleWriter() bool })
	return ok && sw.SingleWriter()
}

func (s crashingStore) Release(ctx context.Context, l idempotency.Lease) error {
	if s.point == crashDuringRelease {
		die()
	}
	return s.Store.Release(ctx, l)
}

// afterCreate is the handler-side crash point; for during-release it fails
// the handler so that the middleware releases the claim.
func afterCreate(point string) func(context.Context) error {
	switch point {
	case crashInHandler:
		return func(context.Context) error { die(); return nil }
	case crashDuringRelease:
		return func(context.Context) error { return errors.New("injected failure before release") }
	}
	return nil
}

// crashBeforeResponse dies when a committed answer is about to be written:
// an order's 201, or the 2xx by which a payment callback (POST
// /webhooks/…) tells its provider that the event is applied, so that the
// provider sees a transport error and delivers the event again although
// its effect is committed. A webhook's 2xx is written once the event's
// record has committed with its effect (payment.Webhook acknowledges after
// Middleware.Do returns), or for an event type it ignores, which commits
// nothing; its refusals are never 2xx. It wraps the whole mux, since the
// webhook routes are mounted beside the service, not in it.
func crashBeforeResponse(point string, next http.Handler) http.Handler {
	if point != crashAfterCommit {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&dieOnWrite{ResponseWriter: w, payment: strings.HasPrefix(r.URL.Path, "/webhooks/")}, r)
	})
}

type dieOnWrite struct {
	http.ResponseWriter
	payment bool // a payment callback: its success answer is any 2xx
}

func (d *dieOnWrite) WriteHeader(code int) {
	if code == http.StatusCreated || d.payment && code >= 200 && code < 300 {
		die()
	}
	d.ResponseWriter.WriteHeader(code)
}
