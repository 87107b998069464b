package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// A front-end that cannot run the handler again the way its framework would
// (idemgin after an aborted run) panics with ErrRerunRefused. Whatever the
// handler wrote and whatever IsFinalFunc says, the run is rolled back, the
// key released and the client told to retry: never a stored answer, never
// a commit.
func TestRerunRefused_RollsBackReleasesAndAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		db := newMySQL(t)
		mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
			Mode:        mode,
			IsFinalFunc: func(int) bool { return true }, // a 503 written by a handler would be stored
		})
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, _ := idempotency.TxFromContext(r.Context())
			_, err := tx.Exec(`INSERT INTO purchase_order (order_no, scope, user_id, sku_id, quantity, unit_price_cents, discount_cents, total_cents, status)
VALUES ('P1', '', 1, 1, 1, 1, 0, 1, 'INIT')`)
			require.NoError(t, err)
			w.WriteHeader(http.StatusCreated)
			panic(fmt.Errorf("%w: a run after an aborted run", idempotency.ErrRerunRefused))
		})))
		t.Cleanup(srv.Close)
		b := &testBundle{db: db, srv: srv}

		got := b.do(t, call{key: "k", body: `{}`})
		require.Equal(t, http.StatusServiceUnavailable, got.Status, "body: %s", got.Body)
		require.Equal(t, idempotency.ProblemRerunRefused, got.problemType(t))
		require.Equal(t, "1", got.Header.Get("Retry-After"), "the client is told to retry")
		require.Equal(t, 0, b.orders(t), "the run's writes are rolled back")
		require.Equal(t, 0, b.records(t), "nothing is stored for the key: its retry runs as a first run")
	})
}
