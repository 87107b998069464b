package idempotency

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Strings and numbers of the canonical JSON encoding (canonical_json.go).

// str canonicalises the string at c.pos. For keys it also returns where the
// unescaped key is: in data when it had no escapes, else decoded into keys.
func (c *canonicalizer) str(isKey bool) (keyAt, keyLen int, escaped bool, err error) {
	d := c.data
	start := c.pos + 1
	i := start
	// Fast path: without escapes the input bytes are already canonical.
	for ; i < len(d); i++ {
		b := d[i]
		if b == '"' {
			c.out = append(c.out, d[c.pos:i+1]...)
			c.pos = i + 1
			return start, i - start, false, nil
		}
		if b == '\\' {
			break
		}
		if b < 0x20 {
			c.pos = i
			return 0, 0, false, c.syntaxError("control character in string")
		}
	}
	keyAt = len(c.keys)
	c.out = append(c.out, d[c.pos:i]...)
	if isKey {
		c.keys = append(c.keys, d[start:i]...)
	}
	for i < len(d) {
		b := d[i]
		switch {
		case b == '"':
			c.out = append(c.out, '"')
			c.pos = i + 1
			return keyAt, len(c.keys) - keyAt, true, nil
		case b < 0x20:
			c.pos = i
			return 0, 0, false, c.syntaxError("control character in string")
		case b != '\\':
			j := i + 1
			for j < len(d) && d[j] != '"' && d[j] != '\\' && d[j] >= 0x20 {
				j++
			}
			c.out = append(c.out, d[i:j]...)
			if isKey {
				c.keys = append(c.keys, d[i:j]...)
			}
			i = j
			continue
		}
		// An escape.
		c.pos = i
		if i+1 >= len(d) {
			return 0, 0, false, c.syntaxError("")
		}
		var r rune
		switch d[i+1] {
		case '"', '\\', '/':
			r = rune(d[i+1])
			i += 2
		case 'b':
			r, i = '\b', i+2
		case 'f':
			r, i = '\f', i+2
		case 'n':
			r, i = '\n', i+2
		case 'r':
			r, i = '\r', i+2
		case 't':
			r, i = '\t', i+2
		case 'u':
			r = hex4(d[i+2:])
			if r < 0 {
				return 0, 0, false, c.syntaxError("invalid \\u escape")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by a low one encodes a
				// character; anything else has no UTF-8 form.
				lo := rune(-1)
				if r < 0xdc00 && i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' {
					lo = hex4(d[i+2:])
				}
				r = utf16.DecodeRune(r, lo)
				if r == utf8.RuneError {
					return 0, 0, false, c.syntaxError("unpaired surrogate escape")
				}
				i += 6
			}
		default:
			return 0, 0, false, c.syntaxError("invalid escape")
		}
		c.out = appendStringRune(c.out, r)
		if isKey {
			c.keys = utf8.AppendRune(c.keys, r)
		}
	}
	c.pos = i
	return 0, 0, false, c.syntaxError("")
}

// hex4 decodes four hex digits at the start of b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, h := range b[:4] {
		switch {
		case h >= '0' && h <= '9':
			h -= '0'
		case h >= 'a' && h <= 'f':
			h -= 'a' - 10
		case h >= 'A' && h <= 'F':
			h -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(h)
	}
	return r
}

// appendStringRune appends r as it appears inside a canonical string: only
// '"', '\' and control characters are escaped, short forms where JSON has one.
func appendStringRune(b []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(b, '\\', byte(r))
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	if r < 0x20 {
		const digits = "0123456789abcdef"
		return append(b, '\\', 'u', '0', '0', digits[r>>4], digits[r&0xf])
	}
	return utf8.AppendRune(b, r)
}

// number canonicalises the number at c.pos from its text, never through a
// float (lossy) or an arbitrary-precision type (1e999999999 would be huge).
// The value is digits × 10^exp; leading and trailing zeros of the digits are
// stripped into exp and the result written as digits, then "e" and exp
// unless exp is 0. Zero, of either sign, is "0".
func (c *canonicalizer) number() error {
	d := c.data
	i := c.pos
	neg := d[i] == '-'
	if neg {
		i++
	}
	intStart := i
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		c.pos = i
		return c.syntaxError("invalid number")
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(d) && d[i] == '.' {
		i++
		fracStart = i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == fracStart {
			c.pos = i
			return c.syntaxError("invalid number")
		}
		fracEnd = i
	}
	var exp int64
	expOverflow := false
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		expNeg := false
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			expNeg = d[i] == '-'
			i++
		}
		expStart := i
		for ; i < len(d) && d[i] >= '0' && d[i] <= '9'; i++ {
			if exp < 1e17 {
				exp = exp*10 + int64(d[i]-'0')
			} else {
				expOverflow = true
			}
		}
		if i == expStart {
			c.pos = i
			return c.syntaxError("invalid number")
		}
		if expNeg {
			exp = -exp
		}
	}
	c.pos = i

	// The digits are d[intStart:intEnd] followed by d[fracStart:fracEnd];
	// find the first and last non-zero among them.
	intDigits, fracDigits := d[intStart:intEnd], d[fracStart:fracEnd]
	nInt := len(intDigits)
	digit := func(k int) byte {
		if k < nInt {
			return intDigits[k]
		}
		return fracDigits[k-nInt]
	}
	n := nInt + len(fracDigits)
	first := 0
	for first < n && digit(first) == '0' {
		first++
	}
	if first == n {
		c.out = append(c.out, '0')
		return nil
	}
	last := n - 1
	for digit(last) == '0' {
		last--
	}
	// Digit counts are bounded by the input's length, far below 1e17, so an
	// overflowing exponent is out of range whatever the digits are.
	e := exp - int64(len(fracDigits)) + int64(n-1-last)
	if expOverflow || e > maxJSONExponent || e < -maxJSONExponent {
		return fmt.Errorf("%w: JSON: number exponent out of range at offset %d", ErrInvalidBody, intStart)
	}
	if neg {
		c.out = append(c.out, '-')
	}
	if first < nInt {
		c.out = append(c.out, intDigits[first:min(last+1, nInt)]...)
	}
	if last >= nInt {
		c.out = append(c.out, fracDigits[max(first-nInt, 0):last+1-nInt]...)
	}
	if e != 0 {
		c.out = append(c.out, 'e')
		c.out = strconv.AppendInt(c.out, e, 10)
	}
	return nil
}
