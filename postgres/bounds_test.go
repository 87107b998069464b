package postgres_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
)

// The specifications of what PostgreSQL's record table cannot hold. Its
// scope, key, fingerprint and owner are text, which refuses bytes that are
// not UTF-8 and NUL (22021), where MySQL's VARBINARY holds any bytes. A
// request whose scope PostgreSQL cannot hold can never succeed: it is
// refused before anything executes, never told to retry.

// scopeFromHeader is a ScopeFunc that takes the principal from X-User,
// percent-decoded, so that a spec can send any bytes (a NUL cannot travel in
// an HTTP header, but a decoded credential can hold one).
func scopeFromHeader(r *http.Request) (string, error) {
	return url.PathUnescape(r.Header.Get("X-User"))
}

// send sends req and reads the answer in full.
func send(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: string(raw)}
}

func TestBounds_AScopePostgresCannotHold_IsRefused401BeforeTheHandler_WritesNothing_NeverToldToRetry(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		svc := &ledgerService{}
		b := setup(t, idempotency.Config{Mode: mode, ScopeFunc: scopeFromHeader}, svc)
		for name, user := range map[string]string{
			"latin-1-header":  "caf\xe9", // not UTF-8, valid HTTP
			"decoded-latin-1": "caf%E9",
			"decoded-nul":     "alice%00admin",
		} {
			for try := 1; try <= 2; try++ {
				req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/ledger", strings.NewReader(`{"account":1,"amount":5}`))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "k-"+name)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-User", user)
				a := send(t, req)
				require.Equal(t, http.StatusUnauthorized, a.Status,
					"%s, try %d: a scope the store cannot hold is refused as bad credentials; got %d %s", name, try, a.Status, a.Body)
				require.Equal(t, idempotency.ProblemScopeRequired, a.problemType(t), name)
				require.Empty(t, a.Header.Get("Retry-After"), "%s: a request that can never succeed is never told to retry", name)
			}
		}
		require.Zero(t, svc.runs.Load(), "the handler never ran for a key its store cannot record")
		require.Zero(t, b.count(t, "SELECT count(*) FROM ledger"), "nothing was written")
		require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_record"), "no record was written")

		a := b.do(t, "k-plain", `{"account":1,"amount":5}`)
		require.Equal(t, http.StatusCreated, a.Status, "a scope PostgreSQL holds (here the empty one) still works: %s", a.Body)
	})
}

// A NUL in a replayed header (a Location built from input, say) is what
// RFC 9110 §5.5 calls invalid and dangerous, and PostgreSQL's jsonb cannot
// hold it (22P05). The middleware turns it into a space, as the RFC tells
// a recipient to and as net/http does with CR and LF, so the first answer
// and every replay agree on every dialect and the order commits.
func TestSnapshot_AHeaderValueHoldingNUL_IsAnsweredAndReplayedWithASpace_InBothModes(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		store := postgres.NewStore(newPostgres(t))
		runs := 0
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.Header().Set("Location", "/orders/a\x00b")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{}`))
		})
		// Each request on an instance of its own: the replay comes from
		// the store, not from the first instance's cache.
		serve := func() *httptest.ResponseRecorder {
			mw, err := idempotency.New(store, &idempotency.Config{Mode: mode})
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "nul-header")
			req.Header.Set("Content-Type", "application/json")
			mw.Handler(handler).ServeHTTP(rec, req)
			return rec
		}
		first := serve()
		require.Equal(t, http.StatusCreated, first.Code, "the order commits: %s", first.Body)
		require.Equal(t, "/orders/a b", first.Header().Get("Location"))
		again := serve()
		require.Equal(t, http.StatusCreated, again.Code, again.Body.String())
		require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
		require.Equal(t, first.Header().Get("Location"), again.Header().Get("Location"), "the replay is the first answer")
		require.Equal(t, 1, runs)
	})
}

// The store's own refusal is the last line of defence: behind a Store that
// does not say what it holds (here the PostgreSQL store with its
// TextChecker hidden), the middleware cannot refuse the scope first, and
// the store refuses the claim (claim-first) or the record (single-phase,
// after the handler ran and before its record was sent) with
// ErrClaimOutOfBounds. That too is a 4xx, never a retry.
func TestBounds_BehindAStoreThatDoesNotSayWhatItHolds_TheStoresRefusalIs400_NeverToldToRetry(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		db := newPostgres(t)
		silent := struct{ idempotency.Store }{postgres.NewStore(db)}
		_, ok := idempotency.Store(silent).(idempotency.TextChecker)
		require.False(t, ok, "the wrapper hides CheckText")
		mw, err := idempotency.New(silent, &idempotency.Config{Mode: mode, ScopeFunc: scopeFromHeader})
		require.NoError(t, err)
		runs := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		}))
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "caf\xe9")
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusBadRequest, rec.Code, "the store's refusal: %s", rec.Body)
		require.Contains(t, rec.Body.String(), idempotency.ProblemTypePrefix+idempotency.ProblemOutOfBounds)
		require.Empty(t, rec.Header().Get("Retry-After"), "a request that can never succeed is never told to retry")
		var records int
		require.NoError(t, db.QueryRow("SELECT count(*) FROM idempotency_record").Scan(&records))
		require.Zero(t, records)
		wantRuns := map[idempotency.Mode]int{idempotency.ModeClaimFirst: 0, idempotency.ModeSinglePhase: 1}[mode]
		require.Equal(t, wantRuns, runs, "claim-first is refused at the claim; single-phase when its record is inserted, rolled back")
	})
}
