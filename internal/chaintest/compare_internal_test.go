package chaintest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func problemResult(status int, kind string, orders ...string) Result {
	return Result{
		Status: status,
		Header: http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"1"}},
		Body:   []byte(`{"type":"` + idempotency.ProblemTypePrefix + kind + `"}`),
		Orders: orders, Runs: 2, AbortedBefore: true,
		Trace: []string{"i0:create", "i1:panic"},
	}
}

func TestCompare_TheSameAnswer_IsNoDivergence(t *testing.T) {
	t.Parallel()
	r := Result{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("{}"), Orders: []string{"1/i0"}}
	div, err := compare(r, r, []Divergence{PanicAnsweredByMiddleware, RerunRefused})
	require.NoError(t, err)
	require.Empty(t, div)
}

func TestCompare_ADocumentedAnswer_IsAllowedOnlyWhenItCommitsNothing(t *testing.T) {
	t.Parallel()
	want := Result{Status: 201, Body: []byte("{}"), Orders: []string{"1/i0"}, Trace: []string{"i0:create", "i1:panic"}, Runs: 1}

	div, err := compare(problemResult(500, idempotency.ProblemExecutionFailed), want, []Divergence{PanicAnsweredByMiddleware})
	require.NoError(t, err)
	require.Equal(t, PanicAnsweredByMiddleware.Name, div)

	_, err = compare(problemResult(500, idempotency.ProblemExecutionFailed, "1/i0"), want, []Divergence{PanicAnsweredByMiddleware})
	require.Error(t, err, "an answer that commits an order is never a documented refusal")
}

func TestCompare_ADivergenceNotAllowedOrNotApplying_IsAMismatch(t *testing.T) {
	t.Parallel()
	want := Result{Status: 400, Trace: []string{"i0:refuse"}, Runs: 2}
	refused := problemResult(503, idempotency.ProblemRerunRefused)

	_, err := compare(refused, want, []Divergence{PanicAnsweredByMiddleware})
	require.ErrorContains(t, err, "status 503, plain 400", "a front-end that does not refuse runs again")

	div, err := compare(refused, want, []Divergence{RerunRefused})
	require.NoError(t, err)
	require.Equal(t, RerunRefused.Name, div)

	refused.AbortedBefore = false
	_, err = compare(refused, want, []Divergence{RerunRefused})
	require.Error(t, err, "a run after runs that did not abort must behave as the framework")

	refused.AbortedBefore, refused.Runs = true, 1
	_, err = compare(refused, want, []Divergence{RerunRefused})
	require.Error(t, err, "a first run is never refused")

	_, err = compare(problemResult(500, idempotency.ProblemExecutionFailed), Result{Status: 500, Trace: []string{"i0:recover", "i1:panic", "i0:recovered"}}, []Divergence{PanicAnsweredByMiddleware})
	require.Error(t, err, "a panic recovered behind the middleware is answered by that recovery")
}

func TestServerRecorder_SendsWhatNetHTTPSends(t *testing.T) {
	t.Parallel()
	r := newServerRecorder()
	r.Header().Set("Location", "/a")
	r.WriteHeader(http.StatusCreated)
	r.Header().Set("X-Late", "1") // after WriteHeader: not sent
	_, _ = r.Write([]byte("plain text"))
	status, header, body := r.result()
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "/a", header.Get("Location"))
	require.Empty(t, header.Get("X-Late"))
	require.Equal(t, "text/plain; charset=utf-8", header.Get("Content-Type"), "sniffed at the first byte")
	require.Equal(t, "plain text", string(body))

	r = newServerRecorder()
	r.Header().Set("Content-Length", "2")
	_, err := r.Write([]byte("abc"))
	require.ErrorIs(t, err, http.ErrContentLength)
	_, _, body = r.result()
	require.Equal(t, "ab", string(body))
}
