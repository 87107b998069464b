package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// Config is one simulation run. DefaultConfig documents the defaults.
type Config struct {
	// Actions is the number of business actions per strategy: genuine user
	// intents to place one order, each the agent's job until it has an
	// answer. Every intent makes at least one create_order tool call;
	// re-plans and resumes add more, runtime retries add HTTP attempts.
	Actions int
	// Concurrency is the number of conversations run at once.
	Concurrency int
	// TimeoutRate is the probability that one create request takes
	// OrderLatency (longer than GatewayTimeout) instead of about BaseLatency.
	TimeoutRate float64
	// ReplanCouponRate is the probability that a re-plan after a failed
	// call switches to another (unused) coupon. After coupon-unavailable
	// the agent always changes the coupon: another one with this
	// probability, none otherwise.
	ReplanCouponRate float64
	// ReplanOrderNoRate is the probability that a re-plan regenerates the
	// client order number (it matters to strategy (b) only).
	ReplanOrderNoRate float64
	// ResumeRate is the probability that an intent's conversation is
	// resumed (the runtime restarted) and re-submits the last call made,
	// at a uniform time within 2 × GatewayTimeout of the intent's start.
	ResumeRate float64
	// CouponRate is the fraction of intents that start with a coupon.
	CouponRate float64
	// GatewayTimeout bounds one HTTP attempt, as the tool gateway does.
	GatewayTimeout time.Duration
	// OrderLatency is the latency of a slow create request (uniform in
	// [1, 1.2] × OrderLatency).
	OrderLatency time.Duration
	// BaseLatency is the mean latency of a normal create request
	// (exponential, capped at 20×).
	BaseLatency time.Duration
	// RetryRate is the probability that the runtime auto-retries a tool
	// call (up to RuntimeRetries times) after a timeout or a retryable
	// answer. Otherwise the failure goes straight back to the model, which
	// re-plans.
	RetryRate float64
	// RuntimeRetries is how often the runtime retries one tool call, with
	// the same arguments, when it does.
	RuntimeRetries int
	// ReplanDelay is the model's mean think time before a re-plan (uniform
	// in [0.5, 1.5] × ReplanDelay).
	ReplanDelay time.Duration
	// MaxReplans is how often the agent re-plans one intent after failed
	// calls before it gives up.
	MaxReplans int
	// LockTTL is the TTL of strategy (c)'s Redis lock.
	LockTTL time.Duration
	// Redis is the address of the Redis for strategy (c).
	Redis string
	// DB is sqlite://DIR (a fresh DIR/agentsim-<strategy>.db each) or
	// mysql://DSN (a fresh database <dbname>_agentsim_<strategy> each).
	DB string
	// Seed fixes the intents, the agent's choices and the fault draws.
	Seed uint64
	// Strategies selects the rows, a subset of "abcd".
	Strategies string
}

// DefaultConfig returns the defaults of the command's flags. DB is left
// empty: the command fills in a temporary directory.
func DefaultConfig() Config {
	return Config{
		Actions:           10000,
		Concurrency:       128,
		TimeoutRate:       0.05,
		ReplanCouponRate:  0.3,
		ReplanOrderNoRate: 0.5,
		ResumeRate:        0.02,
		CouponRate:        0.04,
		GatewayTimeout:    2 * time.Second,
		OrderLatency:      2500 * time.Millisecond,
		BaseLatency:       5 * time.Millisecond,
		RetryRate:         0.5,
		RuntimeRetries:    2,
		ReplanDelay:       time.Second,
		MaxReplans:        2,
		LockTTL:           time.Second,
		Redis:             "127.0.0.1:6379",
		Seed:              1,
		Strategies:        "abcd",
	}
}

// QuickActions is the number of actions per strategy of -quick.
const QuickActions = 500

func (c Config) validate() error {
	switch {
	case c.Actions < 1:
		return errors.New("-actions must be at least 1")
	case c.Concurrency < 1:
		return errors.New("-concurrency must be at least 1")
	case c.GatewayTimeout <= 0 || c.OrderLatency <= 0 || c.BaseLatency <= 0:
		return errors.New("-gateway-timeout, -order-latency and -base-latency must be positive")
	case c.RuntimeRetries < 0 || c.MaxReplans < 0 || c.ReplanDelay < 0:
		return errors.New("-runtime-retries, -max-replans and -replan-delay must not be negative")
	case c.LockTTL <= 0:
		return errors.New("-lock-ttl must be positive")
	}
	for _, r := range []float64{c.TimeoutRate, c.RetryRate, c.ReplanCouponRate, c.ReplanOrderNoRate, c.ResumeRate, c.CouponRate} {
		if r < 0 || r > 1 {
			return errors.New("rates must be within [0, 1]")
		}
	}
	for _, s := range c.Strategies {
		if !strings.ContainsRune("abcd", s) {
			return fmt.Errorf("-strategies %q: want letters of abcd", c.Strategies)
		}
	}
	return nil
}

// Strategy is one row of the comparison.
type Strategy struct {
	ID   string
	Name string
	// Idempotency runs the order service with the middleware.
	Idempotency bool
	// OrderNo makes the agent send a client order number.
	OrderNo bool
	// Lock puts the Redis SET NX lock in front of the handler.
	Lock bool
	// Key makes the agent send client.KeyFor(runID, intentID) through the
	// client package.
	Key bool
}

// Strategies are the four rows, in order.
var Strategies = []Strategy{
	{ID: "a", Name: "no key, new request id per attempt"},
	{ID: "b", Name: "client order number only", OrderNo: true},
	{ID: "c", Name: "Redis SET NX lock (short TTL)", Lock: true},
	{ID: "d", Name: "idempotency key per intent (this library)", Idempotency: true, Key: true},
}

// Result is one strategy's row.
type Result struct {
	Strategy Strategy
	// Skipped, when set, says why the strategy did not run.
	Skipped string

	// From the agents' side.
	Actions         int   // business actions (intents)
	ToolCalls       int64 // create_order calls: initial, re-plans, resumes
	Requests        int64 // HTTP attempts, runtime retries included
	Timeouts        int64 // attempts the gateway timed out (or failed in transport)
	Replans         int64
	Resumes         int64
	Replays         int64 // final answers with Idempotent-Replayed: true
	KeyReused       int64 // 409 key-reused answers: conflicts caught
	GuardRejections int64 // (b) duplicate order number, (c) lock taken (409s)
	GaveUp          int64 // intents the agent ended without an order confirmed
	CouponsShort    int64 // coupon changes that found the pool empty

	// From the database.
	Orders           int // purchase_order rows
	Duplicates       int // rows beyond the first of their intent
	Dirty            int // rows whose parameters differ from their intent's first row
	IntentsWithOrder int
	Stray            int // rows that belong to no intent (must be 0)

	// Latencies.
	ServerReplay []time.Duration // guard+handler time of replayed answers
	ClientReplay []time.Duration // attempt latency of replayed answers at the agent
	EndToEnd     []time.Duration // per action: first call to the agent's final answer
	Wall         time.Duration
}

// DuplicateRate is duplicates per order created.
func (r *Result) DuplicateRate() float64 { return ratio(r.Duplicates, r.Orders) }

// DirtyRate is dirty orders per order created.
func (r *Result) DirtyRate() float64 { return ratio(r.Dirty, r.Orders) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Run runs the selected strategies one after the other, each against a
// fresh database, and returns their rows. Progress goes to log.
func Run(ctx context.Context, cfg Config, log io.Writer) ([]*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	convs := buildConversations(cfg)
	tag := fmt.Sprintf("agentsim:%d:%d", cfg.Seed, time.Now().UnixNano())
	var results []*Result
	for _, st := range Strategies {
		if !strings.Contains(cfg.Strategies, st.ID) {
			continue
		}
		var rdb *redis.Client
		if st.Lock {
			rdb = redis.NewClient(&redis.Options{Addr: cfg.Redis, PoolSize: cfg.Concurrency, MaxRetries: -1})
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			err := rdb.Ping(pctx).Err()
			cancel()
			if err != nil {
				rdb.Close()
				fmt.Fprintf(log, "(%s) skipped: Redis not reachable at %s: %v\n", st.ID, cfg.Redis, err)
				results = append(results, &Result{Strategy: st, Skipped: fmt.Sprintf("Redis not reachable at %s: %v", cfg.Redis, err)})
				continue
			}
		}
		fmt.Fprintf(log, "(%s) %s: %d actions ...\n", st.ID, st.Name, cfg.Actions)
		res, err := runStrategy(ctx, cfg, st, convs, rdb, tag)
		if rdb != nil {
			rdb.Close()
		}
		if err != nil {
			return results, fmt.Errorf("strategy (%s): %w", st.ID, err)
		}
		fmt.Fprintf(log, "(%s) done in %s: %d orders, %d duplicates, %d dirty\n",
			st.ID, res.Wall.Round(time.Millisecond), res.Orders, res.Duplicates, res.Dirty)
		results = append(results, res)
	}
	return results, nil
}

// intent is one genuine user request for one order. Its (user, SKU) pair is
// unique, which is how orders in the database are attributed to it.
type intent struct {
	idx      int
	conv     int
	id       string // "intent-k" within the conversation
	user     int64
	sku      int64
	quantity int
	coupon   bool
}

// buildConversations splits Actions intents into conversations of one to
// three intents of one user each; a user's intents order distinct SKUs.
func buildConversations(cfg Config) [][]*intent {
	var convs [][]*intent
	for idx := 0; idx < cfg.Actions; {
		c := len(convs)
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(c)))
		n := min(1+rng.IntN(3), cfg.Actions-idx)
		skus := rng.Perm(orderservice.LastSKU - orderservice.FirstSKU + 1)
		var conv []*intent
		for k := range n {
			conv = append(conv, &intent{
				idx:      idx,
				conv:     c,
				id:       "intent-" + strconv.Itoa(k+1),
				user:     100000 + int64(c),
				sku:      orderservice.FirstSKU + int64(skus[k]),
				quantity: 1 + rng.IntN(5),
				coupon:   rng.Float64() < cfg.CouponRate,
			})
			idx++
		}
		convs = append(convs, conv)
	}
	return convs
}

// runner runs one strategy's agents.
type runner struct {
	cfg   Config
	st    Strategy
	srv   *simServer
	http  *http.Client
	keyed []*client.Client // strategy (d): [0] without runtime retries, [1] with

	nextCoupon atomic.Int64
	nextReq    atomic.Int64

	res        Result
	toolCalls  atomic.Int64
	requests   atomic.Int64
	timeouts   atomic.Int64
	replans    atomic.Int64
	resumes    atomic.Int64
	replays    atomic.Int64
	keyReused  atomic.Int64
	guardRej   atomic.Int64
	gaveUp     atomic.Int64
	couponMiss atomic.Int64

	mu           sync.Mutex
	e2e          []time.Duration
	clientReplay []time.Duration
}

func runStrategy(ctx context.Context, cfg Config, st Strategy, convs [][]*intent, rdb *redis.Client, tag string) (*Result, error) {
	srv, err := startServer(ctx, cfg, st, rdb, tag)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	tr := &http.Transport{
		MaxIdleConns:        2 * cfg.Concurrency,
		MaxIdleConnsPerHost: 2 * cfg.Concurrency,
		IdleConnTimeout:     30 * time.Second,
	}
	defer tr.CloseIdleConnections()
	r := &runner{cfg: cfg, st: st, srv: srv}
	r.http = &http.Client{Timeout: cfg.GatewayTimeout, Transport: &meter{base: tr, r: r}}
	r.keyed = []*client.Client{
		{HTTP: r.http, Policy: client.Policy{MaxAttempts: 1}},
		{HTTP: r.http, Policy: client.Policy{MaxAttempts: 1 + cfg.RuntimeRetries}},
	}

	start := time.Now()
	jobs := make(chan []*intent)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			for conv := range jobs {
				for _, in := range conv {
					r.runIntent(ctx, in)
				}
			}
		})
	}
	for _, conv := range convs {
		select {
		case jobs <- conv:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	if err := srv.drain(); err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &r.res
	res.Strategy = st
	res.Wall = time.Since(start)
	res.Actions = cfg.Actions
	res.ToolCalls, res.Requests, res.Timeouts = r.toolCalls.Load(), r.requests.Load(), r.timeouts.Load()
	res.Replans, res.Resumes, res.Replays = r.replans.Load(), r.resumes.Load(), r.replays.Load()
	res.KeyReused, res.GuardRejections, res.GaveUp = r.keyReused.Load(), r.guardRej.Load(), r.gaveUp.Load()
	res.CouponsShort = r.couponMiss.Load()
	res.EndToEnd, res.ClientReplay, res.ServerReplay = r.e2e, r.clientReplay, srv.replayLatencies()
	if err := countOrders(ctx, srv.db, convs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// countOrders reads every order back and attributes it to its intent by
// (user_id, sku_id): the first row (lowest id) of an intent is its order,
// every further row a duplicate, and a row whose quantity or coupon differs
// from the first row's is dirty.
func countOrders(ctx context.Context, db *sql.DB, convs [][]*intent, res *Result) error {
	type pair struct{ user, sku int64 }
	known := map[pair]bool{}
	for _, conv := range convs {
		for _, in := range conv {
			known[pair{in.user, in.sku}] = true
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT user_id, sku_id, quantity, coupon_id FROM purchase_order ORDER BY user_id, sku_id, id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	type params struct {
		quantity int
		coupon   sql.NullInt64
	}
	first := map[pair]params{}
	for rows.Next() {
		var p pair
		var q params
		if err := rows.Scan(&p.user, &p.sku, &q.quantity, &q.coupon); err != nil {
			return err
		}
		res.Orders++
		if !known[p] {
			res.Stray++
			continue
		}
		f, seen := first[p]
		if !seen {
			first[p] = q
			continue
		}
		res.Duplicates++
		if q != f {
			res.Dirty++
		}
	}
	res.IntentsWithOrder = len(first)
	return rows.Err()
}

// call is one create_order tool call as the agent planned it.
type call struct {
	idx     int // 0 the first, 1.. re-plans, 100 a resume
	coupon  int64
	orderNo string
}

// class is what the agent makes of a call's final answer.
type class int

const (
	classOK       class = iota // an order: new, replayed, or (b) the order number exists
	classConflict              // key-reused: the intent already has a different order
	classCoupon                // coupon-unavailable: re-plan with another coupon or none
	classUnknown               // timeout, 5xx, in-progress: re-plan
	classFailed                // any other refusal: give up
)

// runIntent is the agent working on one intent until it has an answer.
func (r *runner) runIntent(ctx context.Context, in *intent) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(in.idx)<<1|1))
	cur := call{orderNo: orderNo(in, 0)}
	if in.coupon {
		cur.coupon = r.coupon()
	}
	gen := 0

	var last struct {
		sync.Mutex
		c call
	}
	last.c = cur
	var resume sync.WaitGroup
	if rng.Float64() < r.cfg.ResumeRate {
		delay := time.Duration(rng.Float64() * float64(2*r.cfg.GatewayTimeout))
		resume.Go(func() {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			last.Lock()
			c := last.c
			last.Unlock()
			c.idx = 100
			r.resumes.Add(1)
			r.send(ctx, in, c, 0) // the resumed conversation reports whatever it gets
		})
	}

	start := time.Now()
	for replans := 0; ; {
		last.Lock()
		last.c = cur
		last.Unlock()
		retries := 0
		if rng.Float64() < r.cfg.RetryRate {
			retries = r.cfg.RuntimeRetries
		}
		cl := r.send(ctx, in, cur, retries)
		if cl == classOK || cl == classConflict {
			break
		}
		if cl == classFailed || replans == r.cfg.MaxReplans || ctx.Err() != nil {
			r.gaveUp.Add(1)
			break
		}
		// Re-plan: a new call (new request id), sometimes a new order
		// number, sometimes another coupon.
		replans++
		r.replans.Add(1)
		next := call{idx: replans, coupon: cur.coupon, orderNo: cur.orderNo}
		if rng.Float64() < r.cfg.ReplanOrderNoRate {
			gen++
			next.orderNo = orderNo(in, gen)
		}
		change := rng.Float64() < r.cfg.ReplanCouponRate
		switch {
		case change:
			next.coupon = r.coupon()
		case cl == classCoupon:
			next.coupon = 0
		}
		cur = next
		think := time.Duration((0.5 + rng.Float64()) * float64(r.cfg.ReplanDelay))
		select {
		case <-time.After(think):
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	r.e2e = append(r.e2e, time.Since(start))
	r.mu.Unlock()
	resume.Wait()
}

// coupon takes an unused coupon id, or 0 when the pool is exhausted.
func (r *runner) coupon() int64 {
	id := r.nextCoupon.Add(1)
	if id > orderservice.LastCoupon {
		r.couponMiss.Add(1)
		return 0
	}
	return id
}

func orderNo(in *intent, gen int) string {
	return fmt.Sprintf("S%d-%d-%d", in.conv, in.idx, gen)
}

// send makes one tool call with up to retries runtime retries and
// classifies the final answer.
func (r *runner) send(ctx context.Context, in *intent, c call, retries int) class {
	r.toolCalls.Add(1)
	body := orderservice.CreateRequest{UserID: in.user, SKUID: in.sku, Quantity: in.quantity}
	if c.coupon != 0 {
		body.CouponID = &c.coupon
	}
	if r.st.OrderNo {
		body.OrderNo = c.orderNo
	}
	b, _ := json.Marshal(body)
	newReq := func() *http.Request {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.url+"/orders", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", strconv.FormatInt(in.user, 10))
		req.Header.Set("X-Request-ID", "req-"+strconv.FormatInt(r.nextReq.Add(1), 10))
		req.Header.Set(headerCall, fmt.Sprintf("%d/%d", in.idx, c.idx))
		req.Header.Set(headerIntent, in.id)
		return req
	}

	if r.st.Key {
		// (d): the client package, with the intent's stable key. It retries
		// timeouts and in-progress itself, always with the same key.
		key := client.KeyFor(fmt.Sprintf("sim-%d-conv-%d", r.cfg.Seed, in.conv), in.id)
		kc := r.keyed[0]
		if retries > 0 {
			kc = r.keyed[1]
		}
		res, err := kc.Do(ctx, newReq(), key)
		if err != nil {
			return classUnknown
		}
		defer res.Response.Body.Close()
		_, _ = io.Copy(io.Discard, res.Response.Body)
		return r.classify(res.Response.StatusCode, res.Problem.Kind(), res.Replayed)
	}

	// (a)-(c): the runtime retries the same call itself, each attempt with a
	// new request id, with the client package's backoff and Retry-After.
	var cl class
	for attempt := 1; ; attempt++ {
		resp, err := r.http.Do(newReq())
		retry := false
		var wait time.Duration
		if err != nil {
			cl, retry = classUnknown, true
		} else {
			var p client.Problem
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
				_ = json.Unmarshal(raw, &p)
			}
			kind := p.Kind()
			cl = r.classify(resp.StatusCode, kind, false)
			switch {
			case resp.StatusCode == http.StatusConflict && kind == client.ProblemInProgress,
				resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
				resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
				retry = true
				if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
					wait = time.Duration(s) * time.Second
				}
			}
		}
		if !retry || attempt > retries || ctx.Err() != nil {
			return cl
		}
		if wait == 0 {
			wait = backoff(attempt)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return classUnknown
		}
	}
}

// backoff is the client package's default full-jitter backoff.
func backoff(attempt int) time.Duration {
	ceiling := min(client.DefaultInitialDelay<<(attempt-1), client.DefaultMaxDelay)
	return time.Duration(rand.Float64() * float64(ceiling))
}

func (r *runner) classify(status int, kind string, replayed bool) class {
	switch {
	case status >= 200 && status < 300:
		if replayed {
			r.replays.Add(1)
		}
		return classOK
	case status == http.StatusConflict && kind == client.ProblemKeyReused:
		r.keyReused.Add(1)
		return classConflict
	case status == http.StatusConflict && kind == "duplicate-order":
		// (b): the order number exists, so the order was placed.
		r.guardRej.Add(1)
		return classOK
	case status == http.StatusConflict && kind == client.ProblemInProgress:
		if r.st.Lock {
			r.guardRej.Add(1)
		}
		return classUnknown
	case kind == orderservice.ProblemCouponUnavailable:
		return classCoupon
	case status >= 500 || status == http.StatusTooManyRequests:
		return classUnknown
	default:
		return classFailed
	}
}

// meter counts attempts and transport failures and times replayed answers.
type meter struct {
	base http.RoundTripper
	r    *runner
}

func (m *meter) RoundTrip(req *http.Request) (*http.Response, error) {
	m.r.requests.Add(1)
	start := time.Now()
	resp, err := m.base.RoundTrip(req)
	if err != nil {
		m.r.timeouts.Add(1)
		return resp, err
	}
	if client.Replayed(resp) {
		d := time.Since(start)
		m.r.mu.Lock()
		m.r.clientReplay = append(m.r.clientReplay, d)
		m.r.mu.Unlock()
	}
	return resp, nil
}

// percentile returns the p-th percentile (0–100) by nearest rank, or 0.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}
