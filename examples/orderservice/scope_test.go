package orderservice_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// TestScope_SpellingsOfOnePrincipal_OneKeyOneBody_MakeOneOrderAndReplayIt:
// X-User-ID "7", "+7", "007" and "0007" are all user 7 (authentication
// parses them so), so they share one key space: one order, and every later
// spelling replays the first answer.
func TestScope_SpellingsOfOnePrincipal_OneKeyOneBody_MakeOneOrderAndReplayIt(t *testing.T) {
	t.Parallel()
	const body = `{"user_id":7,"sku_id":20001,"quantity":1}`
	for _, dialect := range orderDialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			b := startOrderService(t, dialect, orderservice.Options{Idempotency: true})

			first := b.create(t, "7", "spelled-key", body)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			require.Empty(t, first.header.Get("Idempotent-Replayed"))

			for _, spelling := range []string{"+7", "007", "0007", "7"} {
				again := b.create(t, spelling, "spelled-key", body)
				require.Equal(t, http.StatusCreated, again.status, "X-User-ID %q: %s", spelling, again.body)
				require.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "X-User-ID %q", spelling)
				require.Equal(t, first.header.Get("Location"), again.header.Get("Location"), "X-User-ID %q", spelling)
				require.Equal(t, first.body, again.body, "X-User-ID %q must replay the first answer", spelling)
			}

			require.Equal(t, 1, b.orders(t), "purchase_order rows")
			require.Equal(t, 1, b.records(t), "idempotency records")
			var scope string
			require.NoError(t, b.db.QueryRow(`SELECT scope FROM idempotency_record`).Scan(&scope))
			require.Equal(t, "7", scope, "the scope is the principal in canonical decimal")
			require.NoError(t, b.db.QueryRow(`SELECT scope FROM purchase_order`).Scan(&scope))
			require.Equal(t, "7", scope)
		})
	}
}

// TestScope_SpellingOfOnePrincipal_WithAnotherBody_IsTheSameKeysConflict: a
// different spelling does not escape the fingerprint check either.
func TestScope_SpellingOfOnePrincipal_WithAnotherBody_IsTheSameKeysConflict(t *testing.T) {
	t.Parallel()
	b := startOrderService(t, "mysql", orderservice.Options{Idempotency: true})
	require.Equal(t, http.StatusCreated, b.create(t, "7", "k", `{"user_id":7,"sku_id":20001,"quantity":1}`).status)

	other := b.create(t, "+7", "k", `{"user_id":7,"sku_id":20001,"quantity":2}`)
	require.Equal(t, http.StatusConflict, other.status, other.body)
	require.Equal(t, idempotency.ProblemKeyReused, other.problemKind(t), "the middleware, not the table's constraint, refuses it")
	require.Equal(t, 1, b.orders(t))
}

// TestScope_HeaderThatIsNotAPositiveDecimal_Is401: the spellings accepted are
// exactly strconv.ParseInt's, positive. (Surrounding blanks never reach it:
// HTTP trims them from header values.)
func TestScope_HeaderThatIsNotAPositiveDecimal_Is401(t *testing.T) {
	t.Parallel()
	b := startOrderService(t, "mysql", orderservice.Options{Idempotency: true})
	for _, user := range []string{"", "0", "-7", "+-7", "7.0", "0x7", "7_0", "seven", "99999999999999999999"} {
		t.Run(user, func(t *testing.T) {
			a := b.create(t, user, "k-"+user, `{"user_id":7,"sku_id":20001,"quantity":1}`)
			require.Equal(t, http.StatusUnauthorized, a.status, "X-User-ID %q: %s", user, a.body)
		})
	}
	require.Zero(t, b.orders(t))
}
