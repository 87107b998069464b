package idempotency_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The specifications of the record table's bounds per dialect: what MySQL's
// VARBINARY holds is served, and what a store says it cannot hold
// (TextChecker) is refused before anything executes.

// boundsBundle is a minimal create handler behind the middleware over store.
type boundsBundle struct {
	store idempotency.Store
	runs  atomic.Int32
}

// serve sends one request on a middleware instance of its own, so that a
// replay comes from the store, not from an instance's cache. user is
// percent-decoded into the scope, so a spec can send any bytes.
func (b *boundsBundle) serve(t *testing.T, cfg idempotency.Config, user, key string) *httptest.ResponseRecorder {
	t.Helper()
	cfg.ScopeFunc = func(r *http.Request) (string, error) { return url.PathUnescape(r.Header.Get("X-User")) }
	mw, err := idempotency.New(b.store, &cfg)
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := b.runs.Add(1)
		scope, _, _ := idempotency.KeyFromContext(r.Context())
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(url.PathEscape(scope) + " run " + string(rune('0'+n))))
	}))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", user)
	h.ServeHTTP(rec, req)
	return rec
}

func TestBounds_MySQLHoldsAnyScopeBytes_EachScopeExecutesOnceAndReplays(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := &boundsBundle{store: idempotency.NewMySQLStore(newMySQL(t))}
		cfg := idempotency.Config{Mode: mode}
		users := []string{"caf\xe9", "caf%E9", "caf", "a%00b", "a", "%FF"}
		first := map[string]string{}
		for _, user := range users {
			rec := b.serve(t, cfg, user, "k")
			require.Equal(t, http.StatusCreated, rec.Code, "scope %q: MySQL's VARBINARY holds any bytes: %s", user, rec.Body)
			first[user] = rec.Body.String()
		}
		require.EqualValues(t, len(users)-1, b.runs.Load(), `"caf\xe9" and "caf%E9" are one scope; every other is its own`)
		for _, user := range users {
			rec := b.serve(t, cfg, user, "k")
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"), "scope %q", user)
			require.Equal(t, first[user], rec.Body.String(), "scope %q replays its own first answer", user)
		}
	})
}

// fussyStore is the MySQL store behind a TextChecker that refuses any
// value holding "~", standing for a dialect whose columns hold less.
type fussyStore struct{ idempotency.Store }

var errTilde = errors.New("holds a tilde")

func (fussyStore) CheckText(s string) error {
	if strings.Contains(s, "~") {
		return errTilde
	}
	return nil
}

func TestBounds_AStoreThatCannotHoldAValue_IsAskedBeforeAnythingExecutes(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		db := newMySQL(t)
		b := &boundsBundle{store: fussyStore{idempotency.NewMySQLStore(db)}}
		cfg := idempotency.Config{Mode: mode}

		t.Run("Scope_401WithoutRetryAfter_NothingWritten", func(t *testing.T) {
			for try := 1; try <= 2; try++ {
				rec := b.serve(t, cfg, "ali~ce", "k-scope")
				require.Equal(t, http.StatusUnauthorized, rec.Code, "try %d: %s", try, rec.Body)
				require.Contains(t, rec.Body.String(), idempotency.ProblemTypePrefix+idempotency.ProblemScopeRequired)
				require.Contains(t, rec.Body.String(), "holds a tilde", "the detail says why")
				require.Empty(t, rec.Header().Get("Retry-After"), "a request that can never succeed is never told to retry")
			}
			require.Zero(t, b.runs.Load(), "the handler never ran")
			var n int
			require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM idempotency_record").Scan(&n))
			require.Zero(t, n, "nothing written")
		})

		t.Run("Fingerprint_500_ABugOfTheFingerprintFunc", func(t *testing.T) {
			fp := cfg
			fp.FingerprintFunc = func(*http.Request, []byte) (string, error) { return "fp~1", nil }
			rec := b.serve(t, fp, "alice", "k-fp")
			require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
			require.Empty(t, rec.Header().Get("Retry-After"))
			require.Zero(t, b.runs.Load(), "the handler never ran")
		})

		t.Run("InstanceID_RefusedByNew", func(t *testing.T) {
			bad := cfg
			bad.InstanceID = "host~1"
			_, err := idempotency.New(b.store, &bad)
			require.ErrorIs(t, err, errTilde, "an owner the store cannot hold fails at construction, not per request")
		})

		rec := b.serve(t, cfg, "alice", "k-ok")
		require.Equal(t, http.StatusCreated, rec.Code, "what the store holds still works: %s", rec.Body)
	})
}
