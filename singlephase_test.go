package idempotency_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// In single-phase mode a concurrent duplicate executes too: its own insert
// into purchase_order meets the winner's UNIQUE (scope, key) first, waits for
// the winner's commit, fails, rolls back and replays the winner's answer. So
// every one of 64 concurrent requests gets the same 201, and only one order
// exists.
func TestSinglePhase_64RequestsOneKey_OneOrderAndEveryoneGetsTheSame201(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Mode: idempotency.ModeSinglePhase}, 50*time.Millisecond)
	const n = 64
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.do(t, call{user: "7", key: "storm", body: createBody(7, 20001, 1, `,"coupon_id":11`)})
		}()
	}
	close(start)
	wg.Wait()

	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.records(t))
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, a.Body)
		require.Equal(t, answers[0].Body, a.Body)
	}
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
}
