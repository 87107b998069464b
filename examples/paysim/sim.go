package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency/examples/orderservice"
)

// Config is one simulation run. DefaultConfig documents the defaults.
type Config struct {
	// Orders is how many orders are created and paid.
	Orders int
	// Concurrency is how many orders are played at once.
	Concurrency int
	// Providers are the providers played, round robin over the orders.
	Providers []*provider
	// DuplicateRate is the probability that a provider delivers one of an
	// order's events again after the order's events were acknowledged.
	DuplicateRate float64
	// ConcurrentRate is the probability that an order's success is
	// delivered twice at the same moment.
	ConcurrentRate float64
	// RefundRate is the probability that an order's payment is refunded;
	// FullRefundRate the probability that such a refund is of the whole
	// amount, in two refunds (else one quarter of it).
	RefundRate, FullRefundRate float64
	// RefundFirstRate is the probability that a refunded order's first
	// refund is delivered before its payment's success.
	RefundFirstRate float64
	// CancelRate is the probability that the user cancels the order at the
	// moment its success is delivered.
	CancelRate float64
	// ForgeRate is the probability that a forged callback (wrong secret,
	// tampered body or no signature) claims a full refund of the order.
	ForgeRate float64
	// StaleRate is the probability that a correctly signed callback with a
	// timestamp past the tolerance claims a full refund of the order (for
	// a provider that signs no time, one signed for another merchant).
	StaleRate float64
	// LostAnswerRate is the probability that the answer to a delivery is
	// lost on the way back: the provider sees a failure and delivers again.
	LostAnswerRate float64
	// Tries bounds the deliveries of one event, the first included.
	Tries int
	// RetryBase is the provider's first retry delay, doubled on each retry:
	// the provider's schedule (minutes to hours) compressed in time.
	RetryBase time.Duration
	// Seed fixes the orders and every choice above.
	Seed uint64
}

// DefaultConfig returns the defaults of the command's flags, without
// providers.
func DefaultConfig() Config {
	return Config{
		Orders:          200,
		Concurrency:     16,
		DuplicateRate:   0.3,
		ConcurrentRate:  0.2,
		RefundRate:      0.5,
		FullRefundRate:  0.5,
		RefundFirstRate: 0.3,
		CancelRate:      0.15,
		ForgeRate:       0.2,
		StaleRate:       0.1,
		LostAnswerRate:  0.1,
		Tries:           6,
		RetryBase:       10 * time.Millisecond,
		Seed:            1,
	}
}

func (c Config) validate() error {
	switch {
	case c.Orders < 1:
		return errors.New("-orders must be at least 1")
	case c.Concurrency < 1:
		return errors.New("-concurrency must be at least 1")
	case c.Tries < 1:
		return errors.New("-tries must be at least 1")
	case c.RetryBase < 0:
		return errors.New("-retry-base must not be negative")
	case len(c.Providers) == 0:
		return errors.New("-providers names none")
	}
	for _, r := range []float64{c.DuplicateRate, c.ConcurrentRate, c.RefundRate, c.FullRefundRate, c.RefundFirstRate,
		c.CancelRate, c.ForgeRate, c.StaleRate, c.LostAnswerRate} {
		if r < 0 || r > 1 {
			return errors.New("rates must be within [0, 1]")
		}
	}
	return nil
}

// forgery is how a forged callback is made.
type forgery string

const (
	forgeWrongSecret forgery = "wrong-secret" // signed with a secret the server does not hold
	forgeTampered    forgery = "tampered"     // genuine signature, body changed after signing
	forgeUnsigned    forgery = "unsigned"     // no signature at all
	forgeStale       forgery = "stale"        // the right secret, signed 10 minutes ago
	// forgeForeign: genuinely signed by the provider, for another merchant
	// (Alipay's app_id of another app): the provider's key may be shared
	// by a merchant's apps, so only the ids tell it is not this one's.
	forgeForeign forgery = "another-merchant"
)

// cancelJitter bounds the delay of a racing cancel after the success's
// delivery starts.
const cancelJitter = 20 * time.Millisecond

// plan is what happens to one order, drawn from the seed before the run.
type plan struct {
	idx        int
	user, sku  int64
	quantity   int
	provider   *provider
	refund     bool
	fullRefund bool
	refundFirst,
	concurrent,
	duplicate,
	cancel bool
	forgeries []forgery
}

func buildPlans(cfg Config) []*plan {
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x9a75))
	forgeKinds := []forgery{forgeWrongSecret, forgeTampered, forgeUnsigned}
	plans := make([]*plan, cfg.Orders)
	for i := range plans {
		p := &plan{
			idx:      i,
			user:     1000 + int64(i),
			sku:      orderservice.FirstSKU + int64(i%(orderservice.LastSKU-orderservice.FirstSKU+1)),
			quantity: 1 + i%3,
			provider: cfg.Providers[i%len(cfg.Providers)],
		}
		p.refund = rng.Float64() < cfg.RefundRate
		p.fullRefund = p.refund && rng.Float64() < cfg.FullRefundRate
		p.refundFirst = p.refund && rng.Float64() < cfg.RefundFirstRate
		p.concurrent = rng.Float64() < cfg.ConcurrentRate
		p.duplicate = rng.Float64() < cfg.DuplicateRate
		p.cancel = rng.Float64() < cfg.CancelRate
		if rng.Float64() < cfg.ForgeRate {
			p.forgeries = append(p.forgeries, forgeKinds[rng.IntN(len(forgeKinds))])
		}
		// A provider that signs no time (Alipay) has no stale deliveries:
		// an old notification is genuine. Its notifications name the
		// merchant instead: one of another merchant's takes the place.
		if rng.Float64() < cfg.StaleRate {
			switch {
			case p.provider.signsTime:
				p.forgeries = append(p.forgeries, forgeStale)
			case p.provider.foreign != nil:
				p.forgeries = append(p.forgeries, forgeForeign)
			}
		}
		plans[i] = p
	}
	return plans
}

// Result is one target's row.
type Result struct {
	Target string
	Orders int // orders created

	Events      int64 // genuine events (distinct ids)
	Deliveries  int64 // webhook HTTP requests, forgeries included
	Retries     int64 // deliveries after a failed one
	LostAnswers int64 // answers dropped on the way back (injected)
	Transport   int64 // deliveries that failed in transport
	Unacked     int64 // genuine events never acknowledged within Tries
	Answers     map[int]int64

	Duplicates, Concurrent, RefundFirst, CancelRaces, CancelsAccepted int64
	Forged                                                            map[forgery]int64

	// From GET /orders/{no}.
	States     map[string]int
	Unexpected int // orders whose state is not what the acknowledged facts make it
	Unknown    int // orders whose facts the answers left unknown

	// Counted says where double applications were counted: "database",
	// "GET /orders" (refunded_cents only: a remote server without -db),
	// or "" when neither could be.
	Counted            string
	Anomalies          map[string]int
	DoubleApplications int
	ForgeriesAccepted  int // answered 2xx, or found applied in the database

	Wall time.Duration
}

// runner plays the providers against one target.
type runner struct {
	cfg  Config
	t    *target
	http *http.Client
	run  string // this run's nonce: ids and keys are fresh on every run

	deliveries, retries, lost, transport, unacked, events   atomic.Int64
	dups, concurrent, refundFirst, cancels, cancelsAccepted atomic.Int64

	mu         sync.Mutex
	answers    map[int]int64
	forged     map[forgery]int64
	forgedOK   map[string]bool   // forged event ids answered 2xx
	forgedIDs  map[string]bool   // every forged event id
	payments   map[string]*truth // provider/payment id → what was sent
	facts      map[string]*facts // order no → what the answers established
	orderOwner map[string]int64  // order no → user
	orderNos   []string
}

// truth is what the simulator sent for one payment: the sound bound on
// what the server may have applied.
type truth struct {
	provider, paymentID string
	events              map[string]bool // genuine event ids
	refunds             int64           // sum of the distinct refunds
}

// facts are what the server's answers established for one order.
type facts struct {
	total int64
	// refundsSent is the sum of the distinct genuine refunds sent: no
	// order may show more refunded.
	refundsSent int64
	paid        bool
	refunded    int64
	cancel      bool
	unknown     bool // an event or the cancel was never answered for certain
}

// Run creates cfg.Orders orders on t and plays their providers' callbacks,
// then reads the orders back and counts from t's database.
func Run(ctx context.Context, cfg Config, t *target) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	r := &runner{
		cfg: cfg, t: t, run: hex.EncodeToString(nonce[:]),
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: 4 * cfg.Concurrency, MaxConnsPerHost: 4 * cfg.Concurrency}},
		answers: map[int]int64{}, forged: map[forgery]int64{}, forgedOK: map[string]bool{}, forgedIDs: map[string]bool{},
		payments: map[string]*truth{}, facts: map[string]*facts{}, orderOwner: map[string]int64{},
	}
	defer r.http.CloseIdleConnections()
	start := time.Now()
	plans := buildPlans(cfg)
	work := make(chan *plan)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for range cfg.Concurrency {
		wg.Go(func() {
			for p := range work {
				if err := r.playOrder(ctx, p); err != nil {
					errOnce.Do(func() { firstErr = err })
				}
			}
		})
	}
	for _, p := range plans {
		if ctx.Err() != nil {
			break
		}
		work <- p
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &Result{
		Target: t.Name, Orders: len(r.orderNos),
		Events: r.events.Load(), Deliveries: r.deliveries.Load(), Retries: r.retries.Load(),
		LostAnswers: r.lost.Load(), Transport: r.transport.Load(), Unacked: r.unacked.Load(),
		Answers: r.answers, Duplicates: r.dups.Load(), Concurrent: r.concurrent.Load(),
		RefundFirst: r.refundFirst.Load(), CancelRaces: r.cancels.Load(), CancelsAccepted: r.cancelsAccepted.Load(),
		Forged: r.forged, States: map[string]int{},
	}
	if err := r.readOrders(ctx, res); err != nil {
		return nil, err
	}
	if t.DB != nil {
		res.DoubleApplications = 0
		if err := r.count(ctx, res); err != nil {
			return nil, fmt.Errorf("count from the database: %w", err)
		}
	} else {
		res.ForgeriesAccepted = len(r.forgedOK)
	}
	res.Wall = time.Since(start)
	return res, nil
}

// playOrder creates the order and plays its provider as the plan says.
func (r *runner) playOrder(ctx context.Context, p *plan) error {
	orderNo, total, err := r.createOrder(ctx, p)
	if err != nil {
		return err
	}
	f := &facts{total: total}
	pv := p.provider
	paymentID := fmt.Sprintf("pi_%s_%d", r.run, p.idx)
	now := time.Now()
	mk := func(suffix string, kind eventKind, amount int64) event {
		ev := event{ID: fmt.Sprintf("evt_%s_%d_%s", r.run, p.idx, suffix), Kind: kind, OrderNo: orderNo,
			PaymentID: paymentID, Amount: amount, Currency: "CNY", At: now, Total: total}
		if kind == kindRefund {
			ev.RefundID = fmt.Sprintf("re_%s_%d_%s", r.run, p.idx, suffix)
		}
		return ev
	}
	success := mk("s", kindSuccess, total)
	var refunds []event
	switch {
	case p.fullRefund:
		half := total / 2
		refunds = append(refunds, mk("r1", kindRefund, half), mk("r2", kindRefund, total-half))
	case p.refund:
		refunds = append(refunds, mk("r1", kindRefund, max(total/4, 1)))
	}
	tr := &truth{provider: pv.Name, paymentID: paymentID, events: map[string]bool{success.ID: true}}
	for i := range refunds {
		tr.events[refunds[i].ID] = true
		tr.refunds += refunds[i].Amount
		refunds[i].Refunded = tr.refunds
	}
	r.mu.Lock()
	r.payments[pv.Name+"/"+paymentID] = tr
	f.refundsSent = tr.refunds
	r.facts[orderNo] = f
	r.orderOwner[orderNo] = p.user
	r.orderNos = append(r.orderNos, orderNo)
	r.mu.Unlock()
	r.events.Add(int64(len(tr.events)))

	seq := append([]event{success}, refunds...)
	if p.refundFirst {
		seq[0], seq[1] = seq[1], seq[0]
		r.refundFirst.Add(1)
	}
	var mu sync.Mutex // guards f while the cancel races
	ack := func(ev event, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !ok:
			f.unknown = true
		case ev.Kind == kindSuccess:
			f.paid = true
		default:
			f.refunded += ev.Amount
		}
	}
	for _, ev := range seq {
		if ev.Kind != kindSuccess || (!p.concurrent && !p.cancel) {
			ack(ev, r.deliver(ctx, pv, ev, "1"))
			continue
		}
		// The success, with a second delivery at the same moment and/or the
		// user's cancel racing it.
		gate := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-gate; ack(ev, r.deliver(ctx, pv, ev, "1")) })
		if p.concurrent {
			r.concurrent.Add(1)
			r.t.expectConcurrent(pv.Name, ev.ID)
			wg.Go(func() { <-gate; r.deliver(ctx, pv, ev, "2") })
		}
		if p.cancel {
			r.cancels.Add(1)
			// The user's tap lands anywhere in the first cancelJitter
			// of the delivery, so that either may commit first.
			jitter := time.Duration(r.draw("cancel", ev.ID, 0) * float64(cancelJitter))
			wg.Go(func() {
				<-gate
				sleep(ctx, jitter)
				accepted, certain := r.cancelOrder(ctx, p, orderNo)
				mu.Lock()
				f.cancel, f.unknown = accepted, f.unknown || !certain
				mu.Unlock()
				if accepted {
					r.cancelsAccepted.Add(1)
				}
			})
		}
		close(gate)
		wg.Wait()
	}
	// Forgeries and stale replays claim the whole amount back, once each.
	for i, kind := range p.forgeries {
		ev := mk(fmt.Sprintf("forged%d", i), kindRefund, total)
		ev.Refunded = total
		r.forge(ctx, pv, ev, kind)
	}
	// The provider delivers one event again, later: its own retry after a
	// timeout it saw, or an at-least-once redelivery.
	if p.duplicate {
		r.dups.Add(1)
		pick := seq[int(r.draw("dup", success.ID, 0)*float64(len(seq)))]
		r.deliver(ctx, pv, pick, "3")
	}
	return nil
}

// createOrder is POST /orders with a key of its own, retried with the key
// on an answer that says to.
func (r *runner) createOrder(ctx context.Context, p *plan) (orderNo string, total int64, err error) {
	body, _ := json.Marshal(orderservice.CreateRequest{UserID: p.user, SKUID: p.sku, Quantity: p.quantity})
	key := fmt.Sprintf("paysim-%s-%d", r.run, p.idx)
	for try := 1; ; try++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.t.URL+"/orders", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", strconv.FormatInt(p.user, 10))
		req.Header.Set("Idempotency-Key", key)
		resp, err := r.http.Do(req)
		if err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated {
				var o orderservice.OrderResponse
				if err := json.Unmarshal(raw, &o); err != nil || o.OrderNo == "" {
					return "", 0, fmt.Errorf("POST /orders: 201 without an order: %s", raw)
				}
				return o.OrderNo, o.TotalCents, nil
			}
			if resp.StatusCode != http.StatusConflict && resp.StatusCode < 500 {
				return "", 0, fmt.Errorf("POST /orders: %d %s", resp.StatusCode, strings.TrimSpace(string(raw)))
			}
			err = fmt.Errorf("POST /orders: %d %s", resp.StatusCode, strings.TrimSpace(string(raw)))
		}
		if try == r.cfg.Tries || ctx.Err() != nil {
			return "", 0, err
		}
		if !sleep(ctx, r.backoff(try)) {
			return "", 0, ctx.Err()
		}
	}
}

// cancelOrder is the user's POST /orders/{no}/cancel: accepted is a 200, certain
// that the answer decided it (a 200 or a 409 the order's state gave).
func (r *runner) cancelOrder(ctx context.Context, p *plan, orderNo string) (accepted, certain bool) {
	key := fmt.Sprintf("paysim-%s-%d-cancel", r.run, p.idx)
	for try := 1; ; try++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.t.URL+"/orders/"+orderNo+"/cancel", nil)
		req.Header.Set("X-User-ID", strconv.FormatInt(p.user, 10))
		req.Header.Set("Idempotency-Key", key)
		resp, err := r.http.Do(req)
		if err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				return true, true
			case resp.StatusCode == http.StatusConflict && bytes.Contains(raw, []byte(orderservice.ProblemInvalidTransition)):
				return false, true
			case resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict:
				return false, true
			}
		}
		if try == r.cfg.Tries || !sleep(ctx, r.backoff(try)) {
			return false, false
		}
	}
}
