package idempotency_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// TestTxOptions_TheHandlersTransactionRunsWithThem: Config.TxOptions is
// the isolation of the transaction the handler runs in (what the payment
// events want on MySQL-family servers), and without it the server's own.
func TestTxOptions_TheHandlersTransactionRunsWithThem(t *testing.T) {
	t.Parallel()
	db := newMySQL(t)
	store := idempotency.NewMySQLStore(db)
	_, err := db.Exec("CREATE TABLE tx_options_probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, at VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	// The isolation shows in what a plain read sees of a row another
	// transaction commits after the handler's first read: REPEATABLE READ
	// keeps the snapshot of that first read, READ COMMITTED sees the row.
	for _, tc := range []struct {
		opts *sql.TxOptions
		want string
	}{
		{nil, "REPEATABLE READ"}, // InnoDB's default
		{&sql.TxOptions{Isolation: sql.LevelReadCommitted}, "READ COMMITTED"},
	} {
		forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
			mw, err := idempotency.New(store, &idempotency.Config{Mode: mode, TxOptions: tc.opts})
			require.NoError(t, err)
			var level string
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, ok := idempotency.TxFromContext(r.Context())
				require.True(t, ok)
				tag := tc.want + "/" + mode.String()
				count := func() (n int) {
					require.NoError(t, tx.QueryRowContext(r.Context(), "SELECT COUNT(*) FROM tx_options_probe WHERE at = ?", tag).Scan(&n))
					return n
				}
				before := count()
				_, err := db.ExecContext(r.Context(), "INSERT INTO tx_options_probe (at) VALUES (?)", tag)
				require.NoError(t, err)
				level = map[bool]string{true: "READ COMMITTED", false: "REPEATABLE READ"}[count() > before]
				w.WriteHeader(http.StatusCreated)
			}))
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", strings.NewReader(`{"a":1}`))
			req.Header.Set("Idempotency-Key", strings.ReplaceAll("tx-options-"+tc.want+"-"+mode.String(), " ", "_"))
			req.Header.Set("X-User-ID", "7")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			require.Equal(t, tc.want, level)
		})
	}
}

// TestTxOptions_OverAStoreWithoutThem_IsRefusedAtConstruction: options
// the store would drop are a mistake to say at once, not a silent default.
func TestTxOptions_OverAStoreWithoutThem_IsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	store := struct{ idempotency.Store }{idempotency.NewMySQLStore(nil)}
	_, err := idempotency.New(store, &idempotency.Config{TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted}})
	require.ErrorContains(t, err, "TxOptionsBeginner")
	_, err = idempotency.New(store, &idempotency.Config{})
	require.NoError(t, err)
}
