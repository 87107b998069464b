package payment_test

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
)

func TestParseDecimal_ExactDecimal_ReturnsMinorUnits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		scale int
		want  int64
	}{
		{"12.34", 2, 1234},
		{"0.01", 2, 1},
		{"100", 2, 10000},
		{"100.5", 2, 10050},
		{"0", 2, 0},
		{"0.00", 2, 0},
		{"07.50", 2, 750},
		{"88.88", 2, 8888},
		{"100000000.00", 2, 10000000000},
		{"5", 0, 5},
		{"1.5", 1, 15},
		{"92233720368547758.07", 2, math.MaxInt64},
		{"9223372036854775807", 0, math.MaxInt64},
		{"9.223372036854775807", 18, math.MaxInt64},
	} {
		t.Run(tc.in+"@"+strconv.Itoa(tc.scale), func(t *testing.T) {
			t.Parallel()
			got, err := payment.ParseDecimal(tc.in, tc.scale)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseDecimal_NotAnExactDecimal_IsErrMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		in    string
		scale int
	}{
		{"empty", "", 2},
		{"negative", "-1", 2},
		{"negative fraction", "-0.01", 2},
		{"leading plus", "+1.00", 2},
		{"exponent", "1e2", 2},
		{"upper exponent", "1E2", 2},
		{"two points", "1.2.3", 2},
		{"more fraction digits than scale", "1.234", 2},
		{"extra fraction zeros", "1.230", 2},
		{"fraction at scale 0", "1.0", 0},
		{"leading space", " 1.00", 2},
		{"trailing space", "1.00 ", 2},
		{"inner space", "1 000.00", 2},
		{"grouping comma", "1,000.00", 2},
		{"point only", ".", 2},
		{"no integer digit", ".5", 2},
		{"no fraction digit", "1.", 2},
		{"hex", "0x10", 2},
		{"infinity", "Inf", 2},
		{"NaN", "NaN", 2},
		{"full-width digit", "１", 2},
		{"overflow by one", "92233720368547758.08", 2},
		{"overflow by scale", "9223372036854775807", 2},
		{"overflow by length", strings.Repeat("9", 40), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := payment.ParseDecimal(tc.in, tc.scale)
			require.ErrorIs(t, err, payment.ErrMalformed)
		})
	}
}

func TestParseDecimal_ScaleOutsideRange_IsProgrammingError(t *testing.T) {
	t.Parallel()
	for _, scale := range []int{-1, 19} {
		_, err := payment.ParseDecimal("1", scale)
		require.Error(t, err)
		require.NotErrorIs(t, err, payment.ErrMalformed)
	}
}

// formatDecimal writes v (non-negative) at scale, as a provider would.
func formatDecimal(v int64, scale int) string {
	digits := strconv.FormatInt(v, 10)
	if scale == 0 {
		return digits
	}
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	return digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
}

func FuzzParseDecimal(f *testing.F) {
	for _, seed := range []string{"12.34", "0.01", "100", "1.2.3", "1e2", "-1", "+1", "", " 1", "92233720368547758.07", "92233720368547758.08", "0.000"} {
		f.Add(seed, int64(1234), uint8(2))
	}
	f.Fuzz(func(t *testing.T, s string, n int64, scaleByte uint8) {
		scale := int(scaleByte % (18 + 1))

		// Any string: never panics; an accepted one is digits and at most
		// one point, and formats back to itself but for leading zeros.
		v, err := payment.ParseDecimal(s, scale)
		if err == nil {
			require.GreaterOrEqual(t, v, int64(0))
			require.NotContains(t, s, "-")
			trimmed := strings.TrimLeft(s, "0")
			if trimmed == "" || trimmed[0] == '.' {
				trimmed = "0" + trimmed
			}
			whole, fraction, _ := strings.Cut(trimmed, ".")
			padded := whole + "." + fraction + strings.Repeat("0", scale-len(fraction))
			if scale == 0 {
				padded = whole
			}
			require.Equal(t, padded, formatDecimal(v, scale))
		} else {
			require.ErrorIs(t, err, payment.ErrMalformed)
		}

		// Any formatted amount: round-trips.
		if n < 0 {
			n = -(n + 1)
		}
		formatted := formatDecimal(n, scale)
		got, err := payment.ParseDecimal(formatted, scale)
		require.NoError(t, err, formatted)
		require.Equal(t, n, got, formatted)
	})
}
