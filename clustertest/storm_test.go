package clustertest_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// TestSameKeyStorm_AcrossNodes_CreatesOneOrder: concurrent retries of one
// request, split between two instances on two nodes, create exactly one
// order. Every answer is that order's 201 (all with the same body) or an
// in-progress 409 with Retry-After, and afterwards every node holds the one
// order and both instances replay it. Which node wins, and whether the race
// is settled by a local lock or by certification, varies from storm to
// storm, so the test runs several.
func TestSameKeyStorm_AcrossNodes_CreatesOneOrder(t *testing.T) {
	const (
		storms   = 5
		requests = 32
	)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t)
			cfg := idempotency.Config{Mode: m.mode, Lease: 10 * time.Second}
			ins := []*instance{c.instance(t, 1, cfg), c.instance(t, 2, cfg)}
			before := c.conflicts(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			var all, retries []answer
			won := map[int]int{} // storms won by the instance on node n
			for range storms {
				key := newKey("storm")
				body := createBody(orderservice.FirstSKU)
				answers := make([]answer, requests)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range answers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						answers[i] = ins[i%2].createOrder(ctx, key, body)
					}()
				}
				close(start)
				wg.Wait()
				all = append(all, answers...)

				// After the storm, a retry on each instance replays.
				var again []answer
				for _, in := range ins {
					again = append(again, in.createOrder(ctx, key, body))
				}
				retries = append(retries, again...)
				if w := checkStorm(t, c, key, answers, again); w != 0 {
					won[w]++
				}
			}

			t.Logf("%s storm: %d storms of %d concurrent requests for one key, alternating instances on nodes 1 and 2",
				m.name, storms, requests)
			t.Logf("  answers: %s; max latency %v", tally(all), maxLatency(all))
			t.Logf("  storms won by instance 1: %d, instance 2: %d", won[1], won[2])
			t.Logf("  executions (order rows written, committed or not): instance 1: %d, instance 2: %d",
				ins[0].executions.Load(), ins[1].executions.Load())
			t.Logf("  retries after the storms: %s", tally(retries))
			t.Logf("  galera conflicts: %s", c.conflictsSince(t, before))
			for _, in := range ins {
				in.logCauses(t)
			}
			reportNonConforming(t, m.name+" storm", all)
		})
	}
}

// checkStorm checks one storm's 201s, the retries after it and the orders on
// every node, and returns the instance whose request created the order (0
// if unknown).
func checkStorm(t *testing.T, c *cluster, key string, answers, retries []answer) int {
	t.Helper()
	var created []answer
	winner := 0
	for _, a := range answers {
		if a.status == http.StatusCreated {
			created = append(created, a)
			if !a.replayed {
				winner = a.instance
			}
		}
	}
	if len(created) == 0 {
		t.Errorf("key %s: no request of the storm was answered 201", key)
		return 0
	}
	for _, a := range created[1:] {
		if !bytes.Equal(a.body, created[0].body) {
			t.Errorf("key %s: 201 bodies differ:\n  %s\n  %s", key, created[0].body, a.body)
		}
	}
	for _, r := range retries {
		if r.status != http.StatusCreated || !bytes.Equal(r.body, created[0].body) {
			t.Errorf("key %s: retry after the storm: want the 201 %s, got %s", key, bytes.TrimSpace(created[0].body), r)
		}
	}
	for _, n := range c.nodes() {
		switch r, ok := c.orders(t, n, scope)[key]; {
		case !ok:
			t.Errorf("key %s: node %d holds no order", key, n)
		case r.count != 1:
			t.Errorf("key %s: node %d holds %d orders", key, n, r.count)
		case r.orderNo != created[0].orderNo:
			t.Errorf("key %s: node %d holds order %s; the 201 named %s", key, n, r.orderNo, created[0].orderNo)
		}
	}
	return winner
}
