package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// stormDuringOriginal sends the original to first, waits until its claim is
// visible, then sends n duplicates to second, all with the same key, and
// waits for every answer.
func stormDuringOriginal(t *testing.T, b *testBundle, first, second *httptest.Server, n int) (answer, []answer) {
	t.Helper()
	return stormDuringHeldOriginal(t, b, first, second, n, nil, 0)
}

// stormDuringHeldOriginal is stormDuringOriginal with the original held:
// when held is not nil, the original's handler waits on it, and it is
// closed once every duplicate has answered, which must be within within.
func stormDuringHeldOriginal(t *testing.T, b *testBundle, first, second *httptest.Server, n int, held chan struct{}, within time.Duration) (answer, []answer) {
	t.Helper()
	var original answer
	done := make(chan struct{})
	go func() {
		defer close(done)
		original = (&testBundle{db: b.db, srv: first}).do(t, call{user: "7", key: "slow", body: createBody(7, 20001, 1, "")})
	}()
	require.Eventually(t, func() bool { return b.records(t) == 1 }, 5*time.Second, time.Millisecond)

	dups := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dups[i] = (&testBundle{db: b.db, srv: second}).do(t, call{user: "7", key: "slow", body: createBody(7, 20001, 1, "")})
		}()
	}
	if held != nil {
		answered := make(chan struct{})
		go func() { wg.Wait(); close(answered) }()
		select {
		case <-answered:
			close(held)
		case <-time.After(within):
			close(held)
			t.Fatalf("the %d duplicates did not all answer within %v while the original was held: InFlightWait did not bound their wait", n, within)
		}
	}
	wg.Wait()
	<-done
	return original, dups
}

func TestInFlightWait_CoversOriginal_32DuplicatesAllGetTheReplayed201(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{InFlightWait: 5 * time.Second}, 400*time.Millisecond)
	original, dups := stormDuringOriginal(t, b, b.srv, b.srv, 32)

	require.Equal(t, http.StatusCreated, original.Status)
	for _, d := range dups {
		require.Equal(t, http.StatusCreated, d.Status, d.Body)
		require.Equal(t, original.Body, d.Body)
		require.Equal(t, "true", d.Header.Get("Idempotent-Replayed"))
	}
	require.Equal(t, 1, b.orders(t))
}

func TestInFlightWait_OtherInstance_PollsTheStoreAndReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{InFlightWait: 5 * time.Second}, 400*time.Millisecond)
	other, err := orderservice.New(b.db, orderservice.Options{Idempotency: true,
		Store: idempotency.NewMySQLStore(b.db), Config: idempotency.Config{InFlightWait: 5 * time.Second}})
	require.NoError(t, err)
	otherSrv := httptest.NewServer(other)
	t.Cleanup(otherSrv.Close)

	original, dups := stormDuringOriginal(t, b, b.srv, otherSrv, 8)
	require.Equal(t, http.StatusCreated, original.Status)
	for _, d := range dups {
		require.Equal(t, http.StatusCreated, d.Status, d.Body)
		require.Equal(t, original.Body, d.Body)
	}
	require.Equal(t, 1, b.orders(t))
}

// The original is held inside its transaction until every duplicate has
// answered, so each meets it in progress however slow the machine: each
// waits out its InFlightWait and is told to come back.
func TestInFlightWait_ShorterThanOriginal_Answers409WithRetryAfter(t *testing.T) {
	t.Parallel()
	held := make(chan struct{})
	b := setupWith(t, orderservice.Options{
		Config: idempotency.Config{InFlightWait: 50 * time.Millisecond},
		AfterCreate: func(ctx context.Context) error {
			select {
			case <-held:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	original, dups := stormDuringHeldOriginal(t, b, b.srv, b.srv, 32, held, 30*time.Second)

	require.Equal(t, http.StatusCreated, original.Status)
	for _, d := range dups {
		require.Equal(t, http.StatusConflict, d.Status, d.Body)
		require.Equal(t, idempotency.ProblemInProgress, d.problemType(t))
		require.Equal(t, "1", d.Header.Get("Retry-After"))
	}
	require.Equal(t, 1, b.orders(t))
}
