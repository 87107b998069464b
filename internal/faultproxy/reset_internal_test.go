package faultproxy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResetInterval_IsDrawnFromTheClosedRange(t *testing.T) {
	t.Parallel()
	const lo, hi = 150 * time.Millisecond, 400 * time.Millisecond
	lowest := func(time.Duration) time.Duration { return 0 }
	highest := func(k time.Duration) time.Duration { return k - 1 }
	require.Equal(t, lo, resetInterval(lo, hi, lowest))
	require.Equal(t, hi, resetInterval(lo, hi, highest))
	require.Equal(t, lo, resetInterval(lo, lo, highest), "a one-point range")

	// Uniform: every tenth of the range is hit about a tenth of the time.
	r := rand.New(rand.NewPCG(1, 2))
	var tenths [10]int
	const draws = 10_000
	for range draws {
		d := resetInterval(lo, hi, func(k time.Duration) time.Duration { return time.Duration(r.Int64N(int64(k))) })
		require.True(t, d >= lo && d <= hi, "%v", d)
		tenths[min(9, int(10*(d-lo)/(hi-lo)))]++
	}
	for i, n := range tenths {
		require.InDelta(t, draws/10, n, draws/50, "tenth %d", i)
	}
}
