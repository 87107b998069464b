package orderservice

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// TestServerProblem_TransientIs503StoreUnavailableRetryAfter1_OtherIs500:
// every server-error answer of the service (write handlers, the unprotected
// baseline's BEGIN, getOrder) is classified by idempotency.IsTransient.
func TestServerProblem_TransientIs503StoreUnavailableRetryAfter1_OtherIs500(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		err       error
		transient bool
	}{
		{"deadlock", fmt.Errorf("x: %w", &mysql.MySQLError{Number: 1213}), true},
		{"lock wait timeout", &mysql.MySQLError{Number: 1205}, true},
		{"bad connection", fmt.Errorf("begin: %w", driver.ErrBadConn), true},
		{"deadline", context.DeadlineExceeded, true},
		{"marked transient", fmt.Errorf("x: %w", idempotency.ErrTransient), true},
		{"duplicate key", &mysql.MySQLError{Number: 1062}, false},
		{"canceled (the handler's lease budget ran out)", context.Canceled, true},
		{"plain", errors.New("boom"), false},
		{"driver text", &mysql.MySQLError{Number: 1146, Message: "Table 'shop.purchase_order' doesn't exist"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			internalError(w, tc.err)
			if tc.transient {
				require.Equal(t, http.StatusServiceUnavailable, w.Code)
				require.Equal(t, "1", w.Header().Get("Retry-After"))
				require.Contains(t, w.Body.String(), idempotency.ProblemTypePrefix+idempotency.ProblemStoreUnavailable)
				require.Contains(t, w.Body.String(), "The database failed for a moment; nothing was recorded. Retry with the same key.")
			} else {
				require.Equal(t, http.StatusInternalServerError, w.Code)
				require.Empty(t, w.Header().Get("Retry-After"))
				require.Contains(t, w.Body.String(), idempotency.ProblemTypePrefix+idempotency.ProblemExecutionFailed)
				require.NotContains(t, w.Body.String(), tc.err.Error(), "a 500 never answers the error's own text")
			}
		})
	}
}

// TestCommitFailure_TransientIs503OutcomeUnknown_NeverNothingRecorded: the
// unprotected baseline's failed COMMIT may have taken effect, so its answer
// never claims otherwise.
func TestCommitFailure_TransientIs503OutcomeUnknown_NeverNothingRecorded(t *testing.T) {
	t.Parallel()
	p := commitFailure(fmt.Errorf("commit: %w", driver.ErrBadConn))
	require.Equal(t, http.StatusServiceUnavailable, p.Status)
	require.Equal(t, idempotency.ProblemTypePrefix+idempotency.ProblemCommitUnknown, p.Type)
	require.Equal(t, 1, p.RetryAfter)
	require.NotContains(t, p.Detail, "nothing was recorded")

	p = commitFailure(errors.New("boom"))
	require.Equal(t, http.StatusInternalServerError, p.Status)
	require.Zero(t, p.RetryAfter)
}

// TestOrderTime_NotBeforeThePeriodStart_ComparedAtTheStoredResolution: an
// order belongs to a record's period when it was created at or after the
// record's created_at, judged at the resolution purchase_order.created_at
// keeps (microseconds on MySQL, whole seconds on SQLite).
func TestOrderTime_NotBeforeThePeriodStart_ComparedAtTheStoredResolution(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 5, 1, 12, 0, 0, 500_000_000, time.UTC) // the record's created_at
	for _, tc := range []struct {
		name  string
		value any // as the driver returns it
		want  bool
	}{
		{"mysql parseTime: same microsecond", start, true},
		{"mysql parseTime: a microsecond later", start.Add(time.Microsecond), true},
		{"mysql parseTime: a microsecond earlier", start.Add(-time.Microsecond), false},
		{"mysql parseTime, other location: same instant", start.In(time.FixedZone("X", 3600)), true},
		{"mysql text: a microsecond earlier", []byte("2025-05-01 12:00:00.499999"), false},
		{"mysql text: same microsecond", []byte("2025-05-01 12:00:00.500000"), true},
		{"sqlite text: same second, written after the claim", "2025-05-01 12:00:00", true},
		{"sqlite text: the second before", "2025-05-01 11:59:59", false},
		{"sqlite text: an hour before (an earlier period)", "2025-05-01 11:00:00", false},
		{"sqlite text: the next second", "2025-05-01 12:00:01", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ot orderTime
			require.NoError(t, ot.Scan(tc.value))
			require.Equal(t, tc.want, ot.notBefore(start))
		})
	}
	var ot orderTime
	require.Error(t, ot.Scan(int64(1)), "an unknown representation is an error, never a guess")
	require.Error(t, ot.Scan("yesterday"))
}
