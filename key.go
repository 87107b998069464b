package idempotency

import (
	"fmt"
	"strings"
)

// ParseKey validates an Idempotency-Key header value and returns the key.
//
// A key is 1..maxLen characters of visible ASCII (0x21–0x7E). The IETF
// Idempotency-Key draft defines the header as an RFC 8941 sf-string, so the
// quoted form ("abc") is accepted too and names the same key as abc; its
// unescaped content must satisfy the same rule. HTTP optional whitespace
// around the value is ignored. A missing header is the caller's concern: an
// empty value is simply invalid here. Every error wraps ErrInvalidKey.
func ParseKey(header string, maxLen int) (string, error) {
	v := strings.Trim(header, " \t")
	if v == "" {
		return "", invalidKey(maxLen, "empty key")
	}
	key := v
	if v[0] == '"' {
		var err error
		if key, err = unquoteSFString(v, maxLen); err != nil {
			return "", err
		}
		if key == "" {
			return "", invalidKey(maxLen, "empty quoted key")
		}
	}
	if len(key) > maxLen {
		return "", invalidKey(maxLen, "key has %d characters", len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			// Report the byte, not the key: the header is untrusted and may
			// end up in logs and problem details.
			return "", invalidKey(maxLen, "byte 0x%02x at position %d is not visible ASCII", c, i)
		}
	}
	return key, nil
}

// unquoteSFString decodes an RFC 8941 sf-string that starts with '"'. Only the
// string itself is decoded; the caller still applies the visible-ASCII rule,
// which is stricter than the sf-string alphabet (it excludes space).
func unquoteSFString(v string, maxLen int) (string, error) {
	var b []byte // nil until the first escape, so plain quoted keys do not allocate
	start := 1
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"':
			if i != len(v)-1 {
				return "", invalidKey(maxLen, "characters after the closing quote")
			}
			if b == nil {
				return v[start:i], nil
			}
			return string(append(b, v[start:i]...)), nil
		case c == '\\':
			if i+1 == len(v) {
				return "", invalidKey(maxLen, "quoted key ends inside an escape")
			}
			if e := v[i+1]; e != '"' && e != '\\' {
				return "", invalidKey(maxLen, "invalid escape at position %d: only \\\" and \\\\ are allowed", i)
			}
			b = append(b, v[start:i]...)
			b = append(b, v[i+1])
			i++
			start = i + 1
		case c < 0x20 || c > 0x7e:
			return "", invalidKey(maxLen, "byte 0x%02x at position %d is not allowed in a quoted key", c, i)
		}
	}
	return "", invalidKey(maxLen, "missing closing quote")
}

// invalidKey builds an ErrInvalidKey error that says what is wrong and what a
// valid key looks like, so the client can fix its request.
func invalidKey(maxLen int, format string, args ...any) error {
	return fmt.Errorf("%w: %s; must be 1-%d visible ASCII characters, optionally as a quoted string",
		ErrInvalidKey, fmt.Sprintf(format, args...), maxLen)
}
