package clustertest_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// load is a set of clients creating orders, each with fresh keys, until
// stopped. A client retries a key after a retryable answer (409 in-progress,
// 503) up to attempts times, waiting as Retry-After says, as a client
// following the contract does.
type load struct {
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []answer
}

// startLoad starts workers clients; pick chooses the instance of a
// worker's i-th key.
func startLoad(workers, attempts int, prefix string, pick func(worker, i int) *instance) *load {
	ctx, stop := context.WithCancel(context.Background())
	l := &load{stop: stop}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				in := pick(w, i)
				key := newKey(prefix + "-w" + strconv.Itoa(w))
				body := createBody(orderservice.FirstSKU + int64(i%100))
				for attempt := 1; ; attempt++ {
					// Not ctx: a request in flight when the load stops
					// finishes, so that its answer is the server's.
					reqCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
					a := in.createOrder(reqCtx, key, body)
					cancel()
					l.mu.Lock()
					l.answers = append(l.answers, a)
					l.mu.Unlock()
					if attempt == attempts || !retryable(a) || ctx.Err() != nil {
						break
					}
					select {
					case <-ctx.Done():
					case <-time.After(retryDelay(a)):
					}
				}
			}
		}()
	}
	return l
}

// finish stops the clients and returns every answer.
func (l *load) finish() []answer {
	l.stop()
	l.wg.Wait()
	return l.snapshot()
}

// snapshot returns the answers so far.
func (l *load) snapshot() []answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]answer(nil), l.answers...)
}

func retryable(a answer) bool {
	return a.status == http.StatusConflict && a.problem.Kind() == idempotency.ProblemInProgress ||
		a.status == http.StatusServiceUnavailable
}

// retryDelay is Retry-After, capped at 1 s to keep the test short; 200 ms
// when the answer has none.
func retryDelay(a answer) time.Duration {
	if s, err := strconv.Atoi(a.retryAfter); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, time.Second)
	}
	return 200 * time.Millisecond
}

// countCreated counts the 201s of instance node among answers, those that
// started at or after from.
func countCreated(answers []answer, node int, from time.Time) int {
	n := 0
	for _, a := range answers {
		if a.instance == node && a.status == http.StatusCreated && !a.start.Before(from) {
			n++
		}
	}
	return n
}

// TestDistinctKeys_AcrossNodes_EveryAcknowledgedOrderOnEveryNode: clients
// creating orders with distinct keys through two instances on two nodes get
// one order per key, and once the cluster settles every node holds every
// order that was acknowledged, and the same orders.
func TestDistinctKeys_AcrossNodes_EveryAcknowledgedOrderOnEveryNode(t *testing.T) {
	const (
		workers  = 8
		duration = 2 * time.Second
	)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t)
			cfg := idempotency.Config{Mode: m.mode, Lease: 10 * time.Second}
			ins := []*instance{c.instance(t, 1, cfg), c.instance(t, 2, cfg)}
			before := c.conflicts(t)

			began := time.Now()
			l := startLoad(workers, 3, "distinct", func(w, i int) *instance { return ins[(w+i)%2] })
			t.Cleanup(func() { l.finish() })
			time.Sleep(duration)
			answers := l.finish()
			elapsed := time.Since(began)

			keys := map[string]bool{}
			for _, a := range answers {
				keys[a.key] = true
			}
			created := countCreated(answers, 1, began) + countCreated(answers, 2, began)
			t.Logf("%s distinct keys: %d workers × %v alternating instances on nodes 1 and 2", m.name, workers, duration)
			t.Logf("  %d requests for %d keys in %v; %d created (%.0f/s)", len(answers), len(keys),
				elapsed.Round(time.Millisecond), created, float64(created)/elapsed.Seconds())
			t.Logf("  answers: %s", tally(answers))
			t.Logf("  201s by instance: node 1: %d, node 2: %d", countCreated(answers, 1, began), countCreated(answers, 2, began))
			t.Logf("  galera conflicts: %s", c.conflictsSince(t, before))
			for _, in := range ins {
				in.logCauses(t)
			}

			reportNonConforming(t, m.name+" distinct keys", answers)
			orders := c.verifyOrders(t, c.nodes(), scope, answers, true)
			t.Logf("  orders on every node: %d", len(orders))
			for _, in := range ins {
				if countCreated(answers, in.node, began) == 0 {
					t.Errorf("instance %d created no order", in.node)
				}
			}
		})
	}
}
