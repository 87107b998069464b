package idempotency_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func TestNew_RefusesConfigurationsThatWouldBreakTheGuarantees(t *testing.T) {
	t.Parallel()
	store := idempotency.NewMySQLStore(nil) // New only keeps it

	cases := map[string]struct {
		cfg  idempotency.Config
		want string
	}{
		"2xx not final":            {idempotency.Config{IsFinalFunc: func(s int) bool { return s >= 400 && s < 500 }}, "IsFinalFunc(200) is false"},
		"Set-Cookie replayed":      {idempotency.Config{ReplayHeaders: []string{"set-cookie"}}, "must never be replayed"},
		"Authorization replayed":   {idempotency.Config{ReplayHeaders: []string{"Authorization"}}, "must never be replayed"},
		"conflict 400":             {idempotency.Config{ConflictStatus: http.StatusBadRequest}, "want 409 or 422"},
		"key longer than schema":   {idempotency.Config{MaxKeyLength: 256}, "want 1..255"},
		"lease under a second":     {idempotency.Config{Lease: 10 * time.Millisecond}, "at least 1s"},
		"retention shorter":        {idempotency.Config{Lease: time.Minute, Retention: time.Second}, "shorter than Lease"},
		"snapshot over MEDIUMBLOB": {idempotency.Config{MaxSnapshotBytes: 32 << 20}, "0..16 MiB"},
		"unknown mode":             {idempotency.Config{Mode: 7}, "unknown Mode"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := idempotency.New(store, &c.cfg)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err := idempotency.New(nil, nil)
	require.ErrorContains(t, err, "needs a Store")
	_, err = idempotency.New(store, nil)
	require.NoError(t, err, "nil config means the defaults")
}

// A mode's name parses back to the mode; anything else is an error.
func TestParseMode_RoundTripsModeString(t *testing.T) {
	for _, m := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		got, err := idempotency.ParseMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := idempotency.ParseMode("single_phase")
	require.Error(t, err)
	require.Equal(t, "Mode(7)", idempotency.Mode(7).String())
}
