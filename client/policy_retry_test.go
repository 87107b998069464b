package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a Policy clock whose Sleep advances it and records each wait.
type fakeClock struct {
	now   time.Time
	waits []time.Duration
}

func (c *fakeClock) policy(p Policy) Policy {
	p.Now = func() time.Time { return c.now }
	p.Sleep = func(ctx context.Context, d time.Duration) error {
		c.waits = append(c.waits, d)
		c.now = c.now.Add(d)
		return ctx.Err()
	}
	p.Rand = func() float64 { return 0.5 }
	return p
}

// Retry, the loop every transport shares, stops at the first final outcome,
// waits what the server asked for when it asked, and the backoff otherwise.
func TestRetry_WaitsTheServersHintElseTheBackoff_StopsAtTheFinalOutcome(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	p := clock.policy(Policy{InitialDelay: 100 * time.Millisecond})
	outcomes := []Outcome{
		{Retry: true, Wait: 2 * time.Second, Answered: true}, // in progress, Retry-After 2
		{Retry: true, Err: errors.New("connection reset")},   // transport error: backoff
		{}, // final
	}
	attempts, err := p.Retry(context.Background(), func(n int) Outcome { return outcomes[n-1] })
	require.NoError(t, err)
	require.Equal(t, 3, attempts)
	require.Equal(t, []time.Duration{2 * time.Second, 100 * time.Millisecond}, clock.waits,
		"the hint first, then half of the second attempt's 200ms ceiling (jitter 0.5)")
}

// When the budget runs out after an answer, the caller returns that answer
// (nil error); after a transport error, Retry gives up with ErrGaveUp.
func TestRetry_BudgetSpent_AnswerReturnedOrGaveUp(t *testing.T) {
	for _, answered := range []bool{true, false} {
		clock := &fakeClock{now: time.Unix(1e9, 0)}
		p := clock.policy(Policy{MaxAttempts: 3})
		cause := errors.New("unavailable")
		attempts, err := p.Retry(context.Background(), func(int) Outcome {
			return Outcome{Retry: true, Err: cause, Answered: answered}
		})
		require.Equal(t, 3, attempts)
		if answered {
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, ErrGaveUp)
		require.ErrorIs(t, err, cause)
	}
}

// A final failed outcome's error is returned as it is, after one attempt;
// a context that ends between attempts stops the loop with its error.
func TestRetry_FinalErrorAndCancelledContext(t *testing.T) {
	boom := errors.New("refused by the caller's redirect policy")
	attempts, err := Policy{}.Retry(context.Background(), func(int) Outcome { return Outcome{Err: boom} })
	require.Equal(t, 1, attempts)
	require.Same(t, boom, err)

	ctx, cancel := context.WithCancel(context.Background())
	attempts, err = Policy{}.Retry(ctx, func(int) Outcome {
		cancel()
		return Outcome{Retry: true, Err: errors.New("in progress")}
	})
	require.Equal(t, 1, attempts)
	require.ErrorIs(t, err, context.Canceled)
}

// Every transport retries the same answers.
func TestRetryable_TheContractsTransientAnswers(t *testing.T) {
	for _, status := range []int{429, 502, 503, 504} {
		require.True(t, Retryable(status, ""), "%d", status)
	}
	require.True(t, Retryable(409, ProblemInProgress))
	for _, kind := range []string{ProblemKeyReused, "", "invalid-transition"} {
		require.False(t, Retryable(409, kind), "409 %q is final", kind)
	}
	for _, status := range []int{200, 201, 400, 404, 422, 500, 501} {
		require.False(t, Retryable(status, ""), "%d", status)
	}
}
