package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/history"
)

// do sends a ledger request as testBundle.do does and records it in the
// bundle's history.
func (b *lostCommitBundle) do(t *testing.T, key, body string) answer {
	t.Helper()
	done := b.hist.Begin(history.Request{Key: key, Fingerprint: body})
	a := b.testBundle.do(t, key, body)
	done(history.Answer(a.Status, a.Header, []byte(a.Body)))
	return a
}

// checkHistory checks every request of a lost-COMMIT spec against the HTTP
// contract's model and the ledger it left (internal/history, with
// porcupine): one entry per key answered 201, the one the answers name.
func (b *lostCommitBundle) checkHistory(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := history.ReadOrders(ctx, b.db, "SELECT idem_key, id::text FROM ledger")
	require.NoError(t, err)
	history.Check(t, b.hist, entries, history.Config{OrderOf: history.JSONField("ledger_id")})
}
