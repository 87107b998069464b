package idempotency_test

// Connection-reset chaos (issue 10, "every fault answer is actionable"): the
// order service under concurrent load while internal/faultproxy resets every
// database connection at random intervals. Whatever statement a reset cuts —
// the claim, a handler query, the finish, the COMMIT, a release, a re-read —
// the client must get an answer it can act on: the order (201), the
// rejection (422), or "retry with the same key later" (409 in-progress or
// 503, each with Retry-After). A 500 tells a client nothing it can act on.
// Once the resets stop, retrying every key until it settles must leave each
// key with at most one order, and every 201 must name that order.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// resetLoad is what one run sends. The control run and the fault run send
// the same load; only the resets differ.
type resetLoad struct {
	workers     int           // clients creating orders with fresh keys, one key at a time
	dupEvery    int           // every dupEvery-th worker sends each of its keys from dupFanout goroutines at once
	dupFanout   int           // goroutines per key on those workers
	rejectEvery int           // every rejectEvery-th key names an unknown SKU: a final 422
	duration    time.Duration // how long workers start new keys
	triesPerKey int           // a sender's attempts at one key during the load
	backoff     time.Duration // pause before a retry during the load, jittered up to twice that
}

var resetChaosLoad = resetLoad{
	workers: 16, dupEvery: 4, dupFanout: 3, rejectEvery: 10,
	duration: 4 * time.Second, triesPerKey: 8, backoff: 25 * time.Millisecond,
}

const (
	resetMin, resetMax  = 150 * time.Millisecond, 400 * time.Millisecond
	resetLease          = 2 * time.Second // short, so that the claims of reset attempts expire while settling
	resetInFlightWait   = time.Second     // claim-first duplicates wait for the original instead of answering 409
	resetRequestTimeout = 10 * time.Second
	resetSettleFor      = resetLease + 6*time.Second // after the resets stop, for every key to answer 201 or 422
	resetSettlePause    = 100 * time.Millisecond
	resetSettlers       = 8
	resetUnknownSKU     = 99999
)

// resetKey is one idempotency key the load created, with what its answers
// said. Fields below body are guarded by resetRun.mu.
type resetKey struct {
	user    int
	key     string
	body    string
	reject  bool // the body names an unknown SKU
	senders int  // goroutines that send it at once during the load

	settled     bool            // answered 201 or 422 at least once
	orderNos    map[string]bool // the order numbers its 201s carried
	got422      bool
	inProgress  int // answers 409 in-progress: a duplicate's InFlightWait ran out first
	unavailable int // answers 503 store-unavailable: the store too slow for a request's budget
}

// resetRun drives one load against one chaosEnv and records every answer.
type resetRun struct {
	e    *chaosEnv
	load resetLoad

	requests atomic.Int64
	settling atomic.Bool

	mu        sync.Mutex
	keys      []*resetKey
	answers   map[string]int // by status and problem type, or "transport error"
	odd       map[string]int // the answers that are not actionable, by phase, status, type and detail
	transport map[string]int // transport errors, by message
	settleReq int
}

func newResetRun(e *chaosEnv, load resetLoad) *resetRun {
	return &resetRun{e: e, load: load, answers: map[string]int{}, odd: map[string]int{}, transport: map[string]int{}}
}

// resetActionable reports whether a client can act on the answer: the
// outcome itself, or a retry-later that says when.
func resetActionable(a answer) bool {
	switch a.Status {
	case http.StatusCreated, http.StatusUnprocessableEntity:
		return true
	case http.StatusConflict, http.StatusServiceUnavailable:
		ra := a.Header.Get("Retry-After")
		if n, err := strconv.Atoi(ra); err == nil && n >= 0 {
			return true
		}
		_, err := http.ParseTime(ra)
		return err == nil
	}
	return false
}

// resetVolatile matches the parts of an error detail that differ between
// occurrences of one failure: addresses and ports.
var resetVolatile = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+|\[::1\]:\d+`)

// record files an answer (or a transport error) to k and reports whether k
// is settled by it.
func (r *resetRun) record(k *resetKey, a answer, err error) bool {
	r.requests.Add(1)
	settling := r.settling.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if settling {
		r.settleReq++
	}
	if err != nil {
		r.answers["transport error"]++
		r.transport[resetVolatile.ReplaceAllString(err.Error(), "ADDR")]++
		return false
	}
	var p struct{ Type, Detail string }
	_ = json.Unmarshal([]byte(a.Body), &p)
	kind := strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
	r.answers[strings.TrimSpace(fmt.Sprintf("%d %s", a.Status, kind))]++
	if !resetActionable(a) {
		phase := "during the load"
		if settling {
			phase = "while settling"
		}
		detail := resetVolatile.ReplaceAllString(p.Detail, "ADDR")
		if p.Type == "" {
			detail = "body: " + resetVolatile.ReplaceAllString(strings.TrimSpace(a.Body), "ADDR")
		}
		r.odd[fmt.Sprintf("%s: %d type=%q Retry-After=%q detail=%q", phase, a.Status, kind, a.Header.Get("Retry-After"), detail)]++
	}
	switch a.Status {
	case http.StatusCreated:
		var o orderservice.OrderResponse
		_ = json.Unmarshal([]byte(a.Body), &o)
		k.orderNos[o.OrderNo] = true // "" if the body carried none: caught below
		k.settled = true
	case http.StatusUnprocessableEntity:
		k.got422 = true
		k.settled = true
	case http.StatusConflict:
		if kind == idempotency.ProblemInProgress {
			k.inProgress++
		}
	case http.StatusServiceUnavailable:
		if kind == idempotency.ProblemStoreUnavailable {
			k.unavailable++
		}
	}
	return k.settled
}

// drive sends k until it settles, tries attempts were made (0: no bound) or
// the next attempt would start after until.
func (r *resetRun) drive(k *resetKey, until time.Time, tries int, pause func() time.Duration) {
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), resetRequestTimeout)
		a, err := r.e.send(ctx, k.user, k.key, k.body)
		cancel()
		if r.record(k, a, err) || try == tries {
			return
		}
		d := pause()
		if time.Now().Add(d).After(until) {
			return
		}
		time.Sleep(d)
	}
}

// runLoad runs the workers for load.duration; a key unsettled by then is
// left for settle.
func (r *resetRun) runLoad() {
	l := r.load
	stopAt := time.Now().Add(l.duration)
	pause := func() time.Duration { return l.backoff + rand.N(l.backoff+1) }
	var wg sync.WaitGroup
	for w := range l.workers {
		fanout := 1
		if w%l.dupEvery == 0 {
			fanout = l.dupFanout
		}
		wg.Go(func() {
			for i := 0; time.Now().Before(stopAt); i++ {
				k := &resetKey{user: w + 1, key: fmt.Sprintf("reset-%d-%d", w, i), senders: fanout, orderNos: map[string]bool{}}
				sku := int(orderservice.FirstSKU) + i%100
				if k.reject = i%l.rejectEvery == l.rejectEvery-1; k.reject {
					sku = resetUnknownSKU
				}
				k.body = createBody(k.user, sku, 1, "")
				r.mu.Lock()
				r.keys = append(r.keys, k)
				r.mu.Unlock()
				var senders sync.WaitGroup
				for range k.senders {
					senders.Go(func() { r.drive(k, stopAt, l.triesPerKey, pause) })
				}
				senders.Wait()
			}
		})
	}
	wg.Wait()
}

// unsettled returns the keys that have not been answered 201 or 422.
func (r *resetRun) unsettled() []*resetKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []*resetKey
	for _, k := range r.keys {
		if !k.settled {
			ks = append(ks, k)
		}
	}
	return ks
}

// settle retries every unsettled key, resetSettlers at a time, until it
// answers 201 or 422 or until passes.
func (r *resetRun) settle(until time.Time) {
	r.settling.Store(true)
	keys := make(chan *resetKey)
	var wg sync.WaitGroup
	for range resetSettlers {
		wg.Go(func() {
			for k := range keys {
				r.drive(k, until, 0, func() time.Duration { return resetSettlePause })
			}
		})
	}
	for _, k := range r.unsettled() {
		keys <- k
	}
	close(keys)
	wg.Wait()
}

// checkOrders asserts, from the database directly, that every key has at
// most one order, a settled key exactly what its answers said, and every
// 201 the order of its key.
func (r *resetRun) checkOrders(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type scopedKey struct{ scope, key string }
	orderOf := map[scopedKey]string{}
	rows, err := r.e.direct.QueryContext(ctx,
		`SELECT scope, idempotency_key, COUNT(*), MIN(order_no) FROM purchase_order GROUP BY scope, idempotency_key`)
	require.NoError(t, err)
	for rows.Next() {
		var sk scopedKey
		var n int
		var orderNo string
		require.NoError(t, rows.Scan(&sk.scope, &sk.key, &n, &orderNo))
		if n > 1 {
			t.Errorf("scope %s key %s has %d orders", sk.scope, sk.key, n)
		}
		orderOf[sk] = orderNo
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	orderNos := map[string]bool{}
	rows, err = r.e.direct.QueryContext(ctx, `SELECT order_no FROM purchase_order`)
	require.NoError(t, err)
	for rows.Next() {
		var no string
		require.NoError(t, rows.Scan(&no))
		orderNos[no] = true
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())

	r.mu.Lock()
	defer r.mu.Unlock()
	var unsettled []string
	for _, k := range r.keys {
		sk := scopedKey{fmt.Sprint(k.user), k.key}
		orderNo, ordered := orderOf[sk]
		delete(orderOf, sk)
		if !k.settled {
			unsettled = append(unsettled, k.key)
		}
		for no := range k.orderNos {
			switch {
			case !orderNos[no]:
				t.Errorf("key %s: a 201 carried order_no %q, which is not in purchase_order", k.key, no)
			case no != orderNo:
				t.Errorf("key %s: a 201 carried order_no %s, but the key's order is %q", k.key, no, orderNo)
			}
		}
		switch {
		case k.reject && ordered:
			t.Errorf("key %s names an unknown SKU but has order %s", k.key, orderNo)
		case k.reject && len(k.orderNos) > 0:
			t.Errorf("key %s names an unknown SKU but was answered 201", k.key)
		case !k.reject && k.got422:
			t.Errorf("key %s is a valid order but was answered 422", k.key)
		case !k.reject && k.settled && !ordered:
			t.Errorf("key %s was answered 201 but has no order", k.key)
		}
	}
	for sk, no := range orderOf {
		t.Errorf("order %s belongs to scope %s key %s, which the load never sent", no, sk.scope, sk.key)
	}
	if len(unsettled) > 0 {
		t.Errorf("%d keys never answered 201 or 422 within %v of the resets ending, e.g. %s",
			len(unsettled), resetSettleFor, strings.Join(unsettled[:min(10, len(unsettled))], ", "))
	}
}

// summary is the run's one line: requests, answers by status, keys.
func (r *resetRun) summary(took time.Duration, unsettledAfterLoad int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var byStatus []string
	for _, a := range slices.Sorted(maps.Keys(r.answers)) {
		byStatus = append(byStatus, fmt.Sprintf("%s ×%d", a, r.answers[a]))
	}
	var dup, reject int
	for _, k := range r.keys {
		if k.reject {
			reject++
		}
		if k.senders > 1 {
			dup++
		}
	}
	return fmt.Sprintf("%d requests (%d while settling) in %v; %d keys (%d sent %d× at once, %d naming an unknown SKU), %d unsettled when the load ended; answers: %s",
		r.requests.Load(), r.settleReq, took.Round(time.Millisecond), len(r.keys), dup, r.load.dupFanout, reject,
		unsettledAfterLoad, strings.Join(byStatus, ", "))
}

// reportOdd fails the test once per kind of answer a client cannot act on.
func (r *resetRun) reportOdd(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, msg := range slices.Sorted(maps.Keys(r.transport)) {
		t.Logf("transport error ×%d: %s", r.transport[msg], msg)
	}
	kinds := slices.SortedFunc(maps.Keys(r.odd), func(a, b string) int { return r.odd[b] - r.odd[a] })
	for _, kind := range kinds {
		t.Errorf("not actionable ×%d: %s", r.odd[kind], kind)
	}
}

func TestChaos_ConnectionResets_EveryAnswerIsActionableAndNoKeyHasTwoOrders(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		mode idempotency.Mode
	}{{"claim-first", idempotency.ModeClaimFirst}, {"single-phase", idempotency.ModeSinglePhase}} {
		t.Run(m.name, func(t *testing.T) {
			cfg := idempotency.Config{Mode: m.mode, Lease: resetLease, InFlightWait: resetInFlightWait}

			// The control: the same load through the proxy, never reset,
			// answers every valid key 201 and every unknown SKU 422 at the
			// first try. Without it a failing fault run proves nothing.
			// One exception, which timing decides: a duplicate sent at
			// once with its original waits InFlightWait for it, and on a
			// busy machine the original may take longer (seen at a load
			// average of 19). The duplicate is then told 409 in-progress,
			// with Retry-After, and retries. And a store the load made too
			// slow for a request's budget is answered 503
			// store-unavailable, with Retry-After (seen at a load average
			// of 24), and retried.
			control := t.Run("no-resets", func(t *testing.T) {
				e := newChaosEnv(t, chaosOptions{proxy: true, cfg: cfg})
				r := newResetRun(e, resetChaosLoad)
				start := time.Now()
				r.runLoad()
				t.Logf("%s: %s", m.name, r.summary(time.Since(start), len(r.unsettled())))
				r.reportOdd(t)
				r.checkOrders(t)
				r.mu.Lock()
				defer r.mu.Unlock()
				answers := slices.DeleteFunc(slices.Sorted(maps.Keys(r.answers)), func(a string) bool {
					return a == "409 in-progress" || a == "503 store-unavailable"
				})
				require.Equal(t, []string{"201", "422 unknown-sku"}, answers, "only 201, the planned 422, a duplicate's 409 in-progress and a retryable 503")
				sends, told := 0, 0
				for _, k := range r.keys {
					if !k.settled {
						t.Errorf("key %s unsettled without resets", k.key)
					}
					if k.inProgress > 0 && k.senders == 1 {
						t.Errorf("key %s had no duplicate but was answered 409 in-progress ×%d", k.key, k.inProgress)
					}
					sends += k.senders
					told += k.inProgress + k.unavailable
				}
				retried := int(r.requests.Load()) - sends
				require.True(t, retried >= 0 && retried <= told,
					"no request was retried but one told 409 in-progress or 503: %d retries, %d such answers (%d keys sent %d times)", retried, told, len(r.keys), sends)
				require.Positive(t, len(r.keys))
			})
			if !control {
				t.Fatal("the control run failed: a fault run would prove nothing")
			}

			t.Run("resets", func(t *testing.T) {
				e := newChaosEnv(t, chaosOptions{proxy: true, cfg: cfg})
				r := newResetRun(e, resetChaosLoad)
				start := time.Now()
				require.NoError(t, e.proxy.StartResets(resetMin, resetMax))
				r.runLoad()
				e.proxy.StopResets()
				resets := e.proxy.ResetStats()
				unsettledAfterLoad := len(r.unsettled())
				r.settle(time.Now().Add(resetSettleFor))

				t.Logf("%s: %s; %d reset rounds (every %v-%v) cut %d connections",
					m.name, r.summary(time.Since(start), unsettledAfterLoad), resets.Rounds, resetMin, resetMax, resets.Links)
				require.Positive(t, resets.Links, "the resets cut connections")
				r.checkOrders(t)
				r.reportOdd(t)
			})
		})
	}
}
