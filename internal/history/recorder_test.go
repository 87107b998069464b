package history

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A server that dies after reading a request, on a connection the client
// reused, makes net/http send the request again (it carries an
// Idempotency-Key): the first attempt may have executed, so it is an
// operation of its own, without an answer. Recorded as one operation, its
// commit would make the second attempt's replay look like a replay of
// nothing (the example server's random kill -9 spec showed exactly that).
func TestBeginHTTP_ARequestNetHTTPSendsTwice_IsTwoOperations(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch requests.Add(1) {
		case 2: // executed, then the process dies before it answers
			conn, _, err := http.NewResponseController(w).Hijack()
			require.NoError(t, err)
			conn.Close()
		case 3:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"order_no":"A"}`))
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"order_no":"W"}`))
		}
	}))
	defer srv.Close()
	rec := NewRecorder()
	send := func(key string) {
		ctx, done := rec.BeginHTTP(context.Background(), Request{Key: key, Fingerprint: "a"})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err, "net/http retried on a new connection")
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		done(Answer(resp.StatusCode, resp.Header, body))
	}
	send("warm") // the connection the next request reuses
	send("k")
	require.EqualValues(t, 3, requests.Load())

	res := rec.Verify(Orders{"warm": {"W"}, "k": {"A"}}, orderNo)
	require.Equal(t, 3, res.Operations, "the warm-up, and k's two attempts")
	require.True(t, res.OK(), res.Report(5))
	ops, _, _, _, _ := rec.sample()
	require.NotEmpty(t, ops[1].resp.Err, "k's first attempt has no answer")
	require.True(t, ops[2].resp.Replayed)
}
