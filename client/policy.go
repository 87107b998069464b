package client

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultHeaderName is the request header that carries the key.
const DefaultHeaderName = "Idempotency-Key"

// Policy defaults, applied to zero (or negative) fields.
const (
	DefaultMaxElapsed   = 30 * time.Second
	DefaultInitialDelay = 100 * time.Millisecond
	DefaultMaxDelay     = 5 * time.Second
)

// Policy configures the retry loop. The zero value is ready to use; every
// zero field takes its documented default.
type Policy struct {
	// MaxElapsed is the total budget: no attempt starts later than
	// MaxElapsed after the first one began. Default 30s.
	MaxElapsed time.Duration
	// InitialDelay is the backoff ceiling before the second attempt; it
	// doubles per attempt up to MaxDelay. Default 100ms.
	InitialDelay time.Duration
	// MaxDelay caps each backoff wait (but not a server's Retry-After).
	// Default 5s.
	MaxDelay time.Duration
	// MaxAttempts limits the number of attempts; 0 means unlimited within
	// MaxElapsed.
	MaxAttempts int
	// HeaderName is the key header. Default DefaultHeaderName.
	HeaderName string
	// Rand returns the jitter factor in [0, 1). Default math/rand/v2.Float64.
	Rand func() float64
	// Sleep waits for d or until ctx is done, returning ctx's error then.
	// Default: a timer raced against ctx.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock used for the budget and for Retry-After dates.
	// Default time.Now.
	Now func() time.Time
}

// withDefaults returns p with every unset field filled in, so the loop never
// has to check for zero values.
func (p Policy) withDefaults() Policy {
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
	if p.InitialDelay <= 0 {
		p.InitialDelay = DefaultInitialDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.MaxAttempts < 0 {
		p.MaxAttempts = 0
	}
	if p.HeaderName == "" {
		p.HeaderName = DefaultHeaderName
	}
	if p.Rand == nil {
		p.Rand = rand.Float64
	}
	if p.Sleep == nil {
		p.Sleep = sleep
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	return p
}

// backoff returns the full-jitter wait after the given 1-based attempt:
// rand × min(MaxDelay, InitialDelay × 2^(attempt-1)). Full jitter spreads
// clients that failed together so they do not retry in lockstep.
func (p Policy) backoff(attempt int) time.Duration {
	ceiling := p.InitialDelay
	for i := 1; i < attempt && ceiling < p.MaxDelay; i++ {
		if ceiling > p.MaxDelay/2 { // doubling would pass the cap (or overflow)
			ceiling = p.MaxDelay
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, p.MaxDelay)
	f := p.Rand()
	if !(f >= 0) { // also catches NaN
		f = 0
	}
	if x := f * float64(ceiling); x < float64(ceiling) {
		return time.Duration(x)
	}
	return ceiling // f ≥ 1, or rounding near the int64 limit would overflow
}

// retryAfter parses a Retry-After header given as delta-seconds or an
// HTTP-date. ok is false when the header is absent, malformed or not in the
// future, in which case the caller falls back to backoff rather than
// retrying in a hot loop.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 64); err == nil {
		if secs > uint64(maxDuration/time.Second) {
			return maxDuration, true
		}
		return time.Duration(secs) * time.Second, secs > 0
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d = t.Sub(now)
	return d, d > 0
}

const maxDuration = time.Duration(1<<63 - 1)

// sleep is the default Policy.Sleep.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
