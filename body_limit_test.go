package idempotency_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// countingBody is a 64 MiB request body that counts what is read from it.
type countingBody struct {
	left, read int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > b.left {
		n = b.left
	}
	for i := range p[:n] {
		p[i] = 'x'
	}
	b.left -= n
	b.read += n
	return int(n), nil
}

func (b *countingBody) Close() error { return nil }

func TestBodyLimit_64MiBBody_IsRefusedAfterReadingAtMostTheLimit(t *testing.T) {
	t.Parallel()
	db, mock, err := sqlmock.New()
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	const limit = 1 << 20
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{MaxBodyBytes: limit})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Fatal("handler must not run") }))

	for name, declared := range map[string]int64{"chunked": -1, "declared length": 64 << 20} {
		t.Run(name, func(t *testing.T) {
			body := &countingBody{left: 64 << 20}
			req := httptest.NewRequest(http.MethodPost, "/orders", nil)
			req.Body, req.ContentLength = body, declared
			req.Header.Set("Idempotency-Key", "k")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
			require.LessOrEqual(t, body.read, int64(limit+1), "never more than the limit is read")
			if declared > 0 {
				require.Zero(t, body.read, "a declared oversize body is refused unread")
			}
		})
	}
	require.NoError(t, mock.ExpectationsWereMet(), "nothing was written")
}
