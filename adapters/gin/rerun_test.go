package idemgin_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// renderErrors is an error middleware as gin users write it: handlers add
// to c.Errors and abort, and it renders the errors when nothing was written.
func renderErrors(c *gin.Context) {
	c.Next()
	if len(c.Errors) > 0 && !c.Writer.Written() {
		c.JSON(http.StatusUnprocessableEntity, gin.H{"errors": c.Errors.Errors()})
	}
}

// createRenewable answers 201 with an order written without the key (the
// first order keeps it), so that a renewed key can create one.
func createRenewable(c *gin.Context) {
	order, err := insertOrder(c, 20001, 1, false)
	if err != nil {
		insertFailed(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"order_no": order.OrderNo})
}

// A guard that refuses without writing works on a new key. When the
// middleware runs the handlers a second time in one request (here: a key
// past its retention is renewed, and the renewal's first run answered a
// non-final status), gin's chain starts already aborted. Plain gin never
// calls the handler after the guard; neither may the second run: it is
// refused (503 rerun-refused, nothing committed, key released), and the
// retry, a new request, runs as a first run.
func TestWrap_RunAgainAfterAGuardRefusedWithoutWriting_NeverRunsTheHandlersAfterIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule  string
		guard gin.HandlerFunc
	}{
		{"c.Status(503); c.Abort()", func(c *gin.Context) {
			c.Status(http.StatusServiceUnavailable)
			c.Abort()
		}},
		{"c.Error(err); c.Abort() with an error renderer in front", func(c *gin.Context) {
			_ = c.Error(errors.New("cart locked"))
			c.Abort()
		}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			t.Parallel()
			var refusing atomic.Bool
			guard := func(c *gin.Context) {
				if refusing.Load() {
					tc.guard(c)
				}
			}
			b := setupWithFront(t, wrap, singlePhaseRenewal, []gin.HandlerFunc{renderErrors}, guard, createRenewable)

			require.Equal(t, http.StatusCreated, b.post(t, "guarded-1", body).Status)
			require.Equal(t, 1, b.count(t, "purchase_order"))
			b.expire(t)
			refusing.Store(true)

			refused := b.post(t, "guarded-1", body)
			require.False(t, refused.Status < 300, "the guard refused, yet the answer is %d: %s", refused.Status, refused.Body)
			require.Equal(t, 1, b.count(t, "purchase_order"), "an order for a request the guard refused")
			require.EqualValues(t, 1, b.creates.Load(), "the handler after the guard ran again")
			require.Equal(t, http.StatusServiceUnavailable, refused.Status)
			require.Equal(t, idempotency.ProblemRerunRefused, refused.problem(t))
			require.NotEmpty(t, refused.Header.Get("Retry-After"))
			require.Zero(t, b.count(t, "idempotency_record"), "the renewal's claim is released")

			refusing.Store(false)
			retry := b.post(t, "guarded-1", body)
			require.Equal(t, http.StatusCreated, retry.Status, "the retry runs as a first run: body %s", retry.Body)
			require.Equal(t, 2, b.count(t, "purchase_order"))
		})
	}
}

// Any run after a run that aborted is refused, even one whose handlers would
// answer by writing: while gin's abort is set, nothing shows where a run
// would stop.
func TestWrap_RunAfterAnAbortedRun_IsRefused503AndCommitsNothing(t *testing.T) {
	t.Parallel()
	var failOnce atomic.Bool
	b := setup(t, wrap, singlePhaseRenewal, func(c *gin.Context) {
		order, err := insertOrder(c, 20001, 1, false)
		if err != nil {
			insertFailed(c, err)
			return
		}
		if failOnce.CompareAndSwap(true, false) {
			c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": "rolled back by the database"})
			return
		}
		c.AbortWithStatusJSON(http.StatusCreated, gin.H{"order_no": order.OrderNo})
	})

	first := b.post(t, "renew-2", body)
	require.Equal(t, http.StatusCreated, first.Status)
	b.expire(t)
	failOnce.Store(true)

	refused := b.post(t, "renew-2", body)
	require.Equal(t, http.StatusServiceUnavailable, refused.Status, "body: %s", refused.Body)
	require.Equal(t, idempotency.ProblemRerunRefused, refused.problem(t))
	require.NotEmpty(t, refused.Header.Get("Retry-After"))
	require.EqualValues(t, 2, b.inner.Load(), "the second run called no handler")
	require.EqualValues(t, 2, b.creates.Load())
	aborted, status, _ := b.outer()
	require.True(t, aborted)
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Zero(t, b.after.Load())
	require.Equal(t, 1, b.count(t, "purchase_order"), "the first request's order only")

	retry := b.post(t, "renew-2", body)
	require.Equal(t, http.StatusCreated, retry.Status, "body: %s", retry.Body)
	require.Equal(t, 2, b.count(t, "purchase_order"))
}
