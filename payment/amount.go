package payment

import (
	"fmt"
	"math"
	"strings"
)

// maxScale bounds ParseDecimal's scale: 10^18 is the largest power of ten
// an int64 holds.
const maxScale = 18

// ParseDecimal reads an exact decimal amount, as providers write money in
// their callbacks ("12.34", "0.01", "100"), as minor units at scale
// (scale 2: yuan to fen, "12.34" is 1234). It never goes through a float.
//
// The form is digits, optionally followed by "." and one to scale digits:
// no sign (an amount in a callback is never negative, and a "+" is not how
// a provider writes one), no exponent, no spaces, no grouping. More
// fraction digits than scale are refused even when they are zeros
// ("1.230" at scale 2): a provider that writes a third decimal for yuan is
// writing something this reader does not understand, and refusing says so
// rather than guessing. Leading zeros ("07.50") are accepted: they are not
// ambiguous.
//
// An amount that is not of this form, or over math.MaxInt64 minor units,
// is an error matching ErrMalformed. A scale outside 0..18 is a
// programming error, reported as a plain error.
func ParseDecimal(s string, scale int) (int64, error) {
	if scale < 0 || scale > maxScale {
		return 0, fmt.Errorf("payment: ParseDecimal scale %d is outside 0..%d", scale, maxScale)
	}
	if s == "" {
		return 0, malformedAmount(s, "empty")
	}
	// A second point stays in fraction, and is refused there as a
	// non-digit.
	whole, fraction, hasPoint := strings.Cut(s, ".")
	if whole == "" {
		return 0, malformedAmount(s, "no digit before the decimal point")
	}
	if hasPoint && fraction == "" {
		return 0, malformedAmount(s, "no digit after the decimal point")
	}
	if len(fraction) > scale {
		return 0, malformedAmount(s, fmt.Sprintf("more than %d fraction digits", scale))
	}
	var v int64
	for _, part := range [...]string{whole, fraction} {
		for i := 0; i < len(part); i++ {
			c := part[i]
			if c < '0' || c > '9' {
				return 0, malformedAmount(s, fmt.Sprintf("%q is not a digit", c))
			}
			var ok bool
			if v, ok = mulAdd(v, 10, int64(c-'0')); !ok {
				return 0, malformedAmount(s, "over the int64 range")
			}
		}
	}
	for range scale - len(fraction) {
		var ok bool
		if v, ok = mulAdd(v, 10, 0); !ok {
			return 0, malformedAmount(s, "over the int64 range")
		}
	}
	return v, nil
}

// mulAdd returns v*m+d for non-negative operands, and false on overflow.
func mulAdd(v, m, d int64) (int64, bool) {
	if v > (math.MaxInt64-d)/m {
		return 0, false
	}
	return v*m + d, true
}

func malformedAmount(s, why string) error {
	return fmt.Errorf("%w: amount %q is not an exact decimal: %s", ErrMalformed, s, why)
}
