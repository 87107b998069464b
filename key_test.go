package idempotency_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func TestParseKey_AcceptsVisibleASCIIAndSFStrings(t *testing.T) {
	t.Parallel()
	const maxLen = 8
	tests := []struct {
		name   string
		header string
		want   string
	}{
		{"uuid-like", "a1b2-c3", "a1b2-c3"},
		{"single character", "x", "x"},
		{"exactly maxLen", "12345678", "12345678"},
		{"all punctuation", "!#$%&'()", "!#$%&'()"},
		{"quote and backslash inside plain key", `a"b\c`, `a"b\c`},
		{"tilde and bang bounds", "~!", "~!"},
		{"OWS trimmed", " \t abc\t ", "abc"},
		{"sf-string equals plain", `"abc"`, "abc"},
		{"sf-string with OWS", ` "abc" `, "abc"},
		{"sf-string escaped quote", `"a\"b"`, `a"b`},
		{"sf-string escaped backslash", `"a\\b"`, `a\b`},
		{"sf-string only escapes", `"\"\\"`, `"\`},
		{"sf-string of exactly maxLen", `"12345678"`, "12345678"},
		{"sf-string maxLen counts unescaped", `"1234567\\"`, `1234567\`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idempotency.ParseKey(tt.header, maxLen)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseKey_RejectsInvalidKeys(t *testing.T) {
	t.Parallel()
	const maxLen = 8
	tests := []struct {
		name    string
		header  string
		message string // part of the error that says what is wrong
	}{
		{"empty", "", "empty key"},
		{"only whitespace", " \t ", "empty key"},
		{"maxLen+1", "123456789", "9 characters"},
		{"sf-string maxLen+1", `"123456789"`, "9 characters"},
		{"inner space", "a b", "byte 0x20 at position 1"},
		{"DEL", "a\x7f", "byte 0x7f"},
		{"non-ASCII", "café", "byte 0xc3"},
		{"control character", "a\x01b", "byte 0x01"},
		{"NUL", "a\x00", "byte 0x00"},
		{"newline", "a\nb", "byte 0x0a"},
		{"unbalanced leading quote", `"abc`, "missing closing quote"},
		{"lone quote", `"`, "missing closing quote"},
		{"text after closing quote", `"abc"d`, "after the closing quote"},
		{"two sf-strings", `"a" "b"`, "after the closing quote"},
		{"empty quoted string", `""`, "empty quoted key"},
		{"space inside quotes", `"a b"`, "byte 0x20"},
		{"only a space inside quotes", `" "`, "byte 0x20"},
		{"invalid escape", `"a\nb"`, "invalid escape"},
		{"escaped letter", `"\a"`, "invalid escape"},
		{"unterminated escape", `"ab\`, "ends inside an escape"},
		{"escaped closing quote only", `"ab\"`, "missing closing quote"},
		{"tab inside quotes", "\"a\tb\"", "byte 0x09"},
		{"non-ASCII inside quotes", `"é"`, "byte 0xc3"},
		{"DEL inside quotes", "\"a\x7f\"", "byte 0x7f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idempotency.ParseKey(tt.header, maxLen)
			require.ErrorIs(t, err, idempotency.ErrInvalidKey)
			require.ErrorContains(t, err, tt.message)
			require.ErrorContains(t, err, "must be 1-8 visible ASCII characters")
			require.Empty(t, got)
		})
	}
}

func TestParseKey_NonPositiveMaxLen_RejectsEverything(t *testing.T) {
	t.Parallel()
	_, err := idempotency.ParseKey("a", 0)
	require.ErrorIs(t, err, idempotency.ErrInvalidKey)
}

// sfString quotes key as an RFC 8941 sf-string.
func sfString(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"", "a", "abc", `"abc"`, `"a\"b"`, `"a\\b"`, `"a\b"`, `""`, `"`, `"a`, `a"`,
		" \tk\t ", "a b", "\x7f", "é", "\x00", `"a" `, `"a"b`, `\"a"`,
		"0123456789abcdef0123456789abcdef", `"\"`, `"\\"`,
	} {
		f.Add(s, uint8(8))
		f.Add(s, uint8(255))
	}
	f.Fuzz(func(t *testing.T, header string, limit uint8) {
		maxLen := int(limit)
		key, err := idempotency.ParseKey(header, maxLen)
		if err != nil {
			require.True(t, errors.Is(err, idempotency.ErrInvalidKey), "error %v does not wrap ErrInvalidKey", err)
			require.Empty(t, key)
			return
		}
		require.GreaterOrEqual(t, len(key), 1)
		require.LessOrEqual(t, len(key), maxLen)
		for i := 0; i < len(key); i++ {
			require.True(t, key[i] >= 0x21 && key[i] <= 0x7e, "byte 0x%02x at %d", key[i], i)
		}

		// The sf-string form names the same key, with or without OWS.
		again, err := idempotency.ParseKey(sfString(key), maxLen)
		require.NoError(t, err)
		require.Equal(t, key, again)
		again, err = idempotency.ParseKey(" \t"+sfString(key)+"\t ", maxLen)
		require.NoError(t, err)
		require.Equal(t, key, again)

		// A valid key that does not start with a quote is its own plain form.
		if key[0] != '"' {
			again, err = idempotency.ParseKey(key, maxLen)
			require.NoError(t, err)
			require.Equal(t, key, again)
		}
	})
}
