package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A PgBouncer that exits on its own during a test (as Debian's 1.18 can
// when a cut ends a cancel request's connection) is started again on the
// same address, as a service manager would, and the crash is counted.
func TestPgBouncer_ExitedOnItsOwn_IsStartedAgainOnItsAddress(t *testing.T) {
	b := PgBouncer(t, "transaction", 2)
	require.Zero(t, b.Crashes(), "crashes before any exit")

	b.proc.mu.Lock()
	first, exited := b.proc.cmd, b.proc.exited
	b.proc.mu.Unlock()
	require.NoError(t, first.Process.Kill())
	<-exited

	answers := func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, b.URL+"?sslmode=disable")
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var one int
		return c.QueryRow(ctx, "SELECT 1").Scan(&one) == nil && one == 1
	}
	require.Eventually(t, answers, 15*time.Second, 20*time.Millisecond, "PgBouncer answers at %s again", b.URL)
	require.Equal(t, 1, b.Crashes(), "one exit, one crash counted")
	b.proc.mu.Lock()
	defer b.proc.mu.Unlock()
	require.NotSame(t, first, b.proc.cmd, "a new process serves the address")
}
