package client

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	derivedKeyRE = regexp.MustCompile(`^ik1-[0-9a-f]{64}$`)
	uuidV7RE     = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
)

// referenceKey follows KeyFor's documented construction step by step, so a
// change to either is caught.
func referenceKey(runID, actionID string) string {
	msg := []byte("orderguard/idempotency-key/v1\x00")
	msg = binary.BigEndian.AppendUint64(msg, uint64(len(runID)))
	msg = append(msg, runID...)
	msg = binary.BigEndian.AppendUint64(msg, uint64(len(actionID)))
	msg = append(msg, actionID...)
	sum := sha256.Sum256(msg)
	return "ik1-" + hex.EncodeToString(sum[:])
}

func TestKeyForMatchesDocumentedConstruction(t *testing.T) {
	t.Parallel()
	pairs := [][2]string{
		{"", ""}, {"run-1", "call-1"}, {"ab", "c"}, {"a", "bc"},
		{"conversación-🙂", "paso 1/ツール"}, {"\x00\xff", "\n"},
	}
	for _, p := range pairs {
		require.Equal(t, referenceKey(p[0], p[1]), KeyFor(p[0], p[1]), "%q", p)
	}
}

func TestKeyForPinnedVectorsFromPython(t *testing.T) {
	t.Parallel()
	// Computed with the Python snippet in KeyFor's documentation.
	vectors := []struct{ run, action, want string }{
		{"run-1", "call-1", "ik1-1a0ccf1047d9a7f09591dd4bb75334644b989152142461a0a54193bd08caedfc"},
		{"conv-42", "tool-call-7", "ik1-81a210f7f241e22fb48d79e3a5588ee7e2d0f45d8e42aa8c9399309b5744c7b9"},
		{"", "", "ik1-2e28c2476b9ed463f3869abbe2f3f5f9e0cd5ffdfc11c835cdb856d7ed3eda70"},
		{"ab", "c", "ik1-92799644a0732b8019983ad09fa9952065edfdd53b9132543d9e8b3ff722cc3f"},
		{"a", "bc", "ik1-60766a44aa750191a081525bcee9e205d89629f55614da20cc7f11b7eace3fac"},
		{"conversación-🙂", "paso 1/ツール", "ik1-859702e3072c42217a54bf848b4ff04f5cf0de3f274ce44ccc9dbc779447df01"},
	}
	for _, v := range vectors {
		require.Equal(t, v.want, KeyFor(v.run, v.action), "KeyFor(%q, %q)", v.run, v.action)
	}
}

func TestKeyForIsAlwaysAValidKeyWhateverTheInput(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("x", 1<<20)
	inputs := [][2]string{
		{huge, huge},
		{strings.Repeat("🙂", 10000), "ツール"},
		{"\x00\x01\x7f", "\xff\xfe invalid UTF-8"},
		{"", ""},
		{"run id with spaces", "call\tid"},
	}
	for _, in := range inputs {
		k := KeyFor(in[0], in[1])
		require.Regexp(t, derivedKeyRE, k)
		require.LessOrEqual(t, len(k), MaxKeyLength)
		require.NoError(t, checkKey(k))
	}
}

func TestKeyForSeparatesRunAndActionBoundaries(t *testing.T) {
	t.Parallel()
	require.NotEqual(t, KeyFor("ab", "c"), KeyFor("a", "bc"))
	require.NotEqual(t, KeyFor("a", ""), KeyFor("", "a"))
	require.NotEqual(t, KeyFor("run", "1"), KeyFor("run", "2"))
	require.Equal(t, KeyFor("run", "1"), KeyFor("run", "1"))
}

func TestNewKeyIsAUniqueUUIDv7(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 10000 {
		k := NewKey()
		require.Regexp(t, uuidV7RE, k)
		require.NoError(t, checkKey(k))
		require.False(t, seen[k], "duplicate key %s", k)
		seen[k] = true
	}
}

func TestNewKeyBeginsWithItsUnixMillisecond(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 15, 4, 5, 678_901_234, time.UTC)
	k := newKeyAt(at)
	ms, err := strconv.ParseUint(k[0:8]+k[9:13], 16, 64)
	require.NoError(t, err)
	require.Equal(t, uint64(at.UnixMilli()), ms)
	frac, err := strconv.ParseUint(k[15:18], 16, 64)
	require.NoError(t, err)
	require.Equal(t, uint64(901_234*4096/1_000_000), frac, "the millisecond's fraction in 12 bits")
}

func TestNewKeysMadeLaterSortLater(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	prev := newKeyAt(at)
	// 250 ns is just over one 12-bit step of a millisecond (244 ns): every
	// later key must sort after the one before it, across the millisecond
	// boundaries of these 5 ms, and a day later.
	for i := 1; i < 20000; i++ {
		k := newKeyAt(at.Add(time.Duration(i) * 250 * time.Nanosecond))
		require.Less(t, prev, k, "key %d", i)
		prev = k
	}
	require.Less(t, prev, newKeyAt(at.Add(24*time.Hour)))
}

func TestCheckKeyAcceptsOnlyOneTo255VisibleASCII(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		key  string
		want error
	}{
		{"empty is no key", "", ErrNoKey},
		{"single char", "a", nil},
		{"255 chars", strings.Repeat("k", 255), nil},
		{"all visible ASCII", "!~\"#azAZ09{}", nil},
		{"256 chars", strings.Repeat("k", 256), ErrInvalidKey},
		{"space", "a b", ErrInvalidKey},
		{"control char", "a\x01", ErrInvalidKey},
		{"DEL", "a\x7f", ErrInvalidKey},
		{"non-ASCII", "clé", ErrInvalidKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorIs(t, checkKey(c.key), c.want)
			if c.want == nil {
				require.NoError(t, checkKey(c.key))
			}
		})
	}
}
