package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// A key header of blanks is no key, as on every front-end: HTTP/1 trims
// the blanks around a value, HTTP/2 does not, and a queue's header is
// what its publisher wrote.
func TestHandler_BlankKeyHeader_IsAMissingKey(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), nil)
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
	for _, blank := range []string{"", " ", "\t", " \t "} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
		r.Header["Idempotency-Key"] = []string{blank} // as HTTP/2 delivers it, untrimmed
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", blank)
		require.Contains(t, w.Body.String(), idempotency.ProblemTypePrefix+idempotency.ProblemMissingKey, "%q", blank)
	}
}
