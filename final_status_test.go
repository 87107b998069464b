package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// ledgerServer serves handler under the middleware in mode over a fresh
// database with a ledger table.
func ledgerServer(t *testing.T, mode idempotency.Mode, handler http.HandlerFunc) *testBundle {
	t.Helper()
	db := newMySQL(t)
	_, err := db.ExecContext(context.Background(),
		"CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, qty INT NOT NULL)")
	require.NoError(t, err)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: mode, ReplayCacheBytes: -1})
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(handler))
	t.Cleanup(srv.Close)
	return &testBundle{db: db, srv: srv}
}

// A 303 See Other points at what the handler wrote: it commits like a 2xx,
// and every retry is sent to the same, existing resource.
func TestRedirect_3xxFromTheHandler_CommitsItsWritesAndIsReplayed(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := ledgerServer(t, mode, func(w http.ResponseWriter, r *http.Request) {
			tx, _ := idempotency.TxFromContext(r.Context())
			res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (qty) VALUES (1)")
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			id, _ := res.LastInsertId()
			w.Header().Set("Location", fmt.Sprintf("/ledger/%d", id))
			w.WriteHeader(http.StatusSeeOther)
		})

		first := b.do(t, call{key: "see-other", body: `{"qty":1}`})
		require.Equal(t, http.StatusSeeOther, first.Status, first.Body)
		var id int
		_, err := fmt.Sscanf(first.Header.Get("Location"), "/ledger/%d", &id)
		require.NoError(t, err)
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger WHERE id = ?", id),
			"the resource the redirect points at exists")

		retry := b.do(t, call{key: "see-other", body: `{"qty":1}`})
		require.Equal(t, http.StatusSeeOther, retry.Status)
		require.Equal(t, first.Header.Get("Location"), retry.Header.Get("Location"))
		require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger"))
	})
}

func TestConfig_IsFinalFuncFalseForA3xx_IsRefused(t *testing.T) {
	t.Parallel()
	_, err := idempotency.New(idempotency.NewMySQLStore(nil), &idempotency.Config{
		IsFinalFunc: func(status int) bool { return status < 300 },
	})
	require.ErrorContains(t, err, "IsFinalFunc(300) is false")
}

// Numbers compare by value in the fingerprint, so {"qty":1.0} and
// {"qty":1} are one request; 1.0 does not decode into an int. The handler's
// 400 is not stored (DefaultIsFinal), so the corrected retry executes rather
// than being replayed the 400 for the whole retention.
func TestBadRequest_400FromTheHandler_IsNotStored_SoTheCorrectedRetryExecutes(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := ledgerServer(t, mode, func(w http.ResponseWriter, r *http.Request) {
			var in struct {
				Qty int `json:"qty"`
			}
			if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
				idempotency.WriteProblem(w, idempotency.NewProblem(http.StatusBadRequest,
					idempotency.ProblemInvalidBody, "Invalid request body", err.Error()))
				return
			}
			tx, _ := idempotency.TxFromContext(r.Context())
			if _, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (qty) VALUES (?)", in.Qty); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})

		bad := b.do(t, call{key: "qty", body: `{"qty":1.0}`})
		require.Equal(t, http.StatusBadRequest, bad.Status, bad.Body)
		require.Zero(t, b.records(t), "a 400 is not stored")

		good := b.do(t, call{key: "qty", body: `{"qty":1}`})
		require.Equal(t, http.StatusCreated, good.Status, good.Body)
		require.Empty(t, good.Header.Get("Idempotent-Replayed"), "executed, not replayed")
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM ledger WHERE qty = 1"))
	})
}

func TestDefaultIsFinal_StoresBusinessAnswersButNotRefusalsToAct(t *testing.T) {
	t.Parallel()
	for status, final := range map[int]bool{
		200: true, 201: true, 303: true, 404: true, 409: true, 422: true,
		400: false, 408: false, 425: false, 429: false, 500: false, 503: false,
	} {
		require.Equal(t, final, idempotency.DefaultIsFinal(status), "status %d", status)
	}
}

// A hijacked connection would answer before the commit and outside the
// snapshot: http.ResponseController's Hijack stops at the recorder.
func TestHijack_FromAProtectedHandler_IsRefused(t *testing.T) {
	t.Parallel()
	var hijackErr error
	b := ledgerServer(t, idempotency.ModeClaimFirst, func(w http.ResponseWriter, r *http.Request) {
		_, _, hijackErr = http.NewResponseController(w).Hijack()
		w.WriteHeader(http.StatusCreated)
	})
	a := b.do(t, call{key: "hijack", body: `{"qty":1}`})
	require.Equal(t, http.StatusCreated, a.Status)
	require.ErrorIs(t, hijackErr, http.ErrNotSupported)
}
