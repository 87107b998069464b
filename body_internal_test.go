package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readBody returns the body as sent, up to limit+1 bytes, whatever length the
// request declared: the declared length only sizes the first buffer.
func TestReadBody_ReturnsTheBodyWhateverTheDeclaredLength(t *testing.T) {
	const limit = 64
	body := strings.Repeat("x", 40)
	for _, tc := range []struct {
		name     string
		declared int64
	}{
		{"unknown (chunked)", -1},
		{"exact", 40},
		{"declared shorter than sent", 10},
		{"declared zero", 0},
		{"declared longer than sent", 60},
		{"declared over the limit", limit + 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readBody(iotest.OneByteReader(strings.NewReader(body)), tc.declared, limit)
			require.NoError(t, err)
			assert.Equal(t, body, string(got))
		})
	}
}

func TestReadBody_StopsOneByteAfterTheLimit(t *testing.T) {
	const limit = 16
	for _, declared := range []int64{-1, limit} {
		got, err := readBody(strings.NewReader(strings.Repeat("y", 1000)), declared, limit)
		require.NoError(t, err)
		assert.Len(t, got, limit+1, "declared %d: the caller sees it is over the limit", declared)
	}
	got, err := readBody(strings.NewReader(strings.Repeat("y", limit)), limit, limit)
	require.NoError(t, err)
	assert.Len(t, got, limit, "a body of exactly the limit is whole")
}

func TestReadBody_ReportsAReadError(t *testing.T) {
	boom := errors.New("connection reset")
	_, err := readBody(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 10, 64)
	assert.ErrorIs(t, err, boom)
}

// The handler can read the body again after the fingerprint read it, on every
// run of the handler, and closing it is harmless.
func TestRewindBody_EveryRunReadsTheWholeBody(t *testing.T) {
	x := &exchange{r: httptest.NewRequest(http.MethodPost, "/orders", nil), body: []byte(`{"sku_id":1}`)}
	for range 3 {
		x.rewindBody()
		got, err := io.ReadAll(x.r.Body)
		require.NoError(t, err)
		assert.Equal(t, `{"sku_id":1}`, string(got))
		require.NoError(t, x.r.Body.Close())
	}
}

// KeyHash is the first 16 hex digits of SHA-256 over the scope's length (8
// bytes, big-endian), the scope and the key: computed here from that
// definition, so logs and metrics keep the same hash for a key across
// releases.
func TestKeyHash_IsItsDocumentedDefinition(t *testing.T) {
	for _, tc := range [][2]string{
		{"", ""}, {"user-1", "k"}, {"user-1k", ""}, {strings.Repeat("s", 255), strings.Repeat("k", 255)},
		{strings.Repeat("s", 300), strings.Repeat("k", 900)}, // larger than any request's: still hashed whole
	} {
		var in bytes.Buffer
		_ = binary.Write(&in, binary.BigEndian, uint64(len(tc[0])))
		in.WriteString(tc[0] + tc[1])
		sum := sha256.Sum256(in.Bytes())
		assert.Equal(t, hex.EncodeToString(sum[:8]), KeyHash(tc[0], tc[1]))
	}
	assert.NotEqual(t, KeyHash("user-1", "k"), KeyHash("user-1k", ""), "the length prefix separates scope from key")
}
