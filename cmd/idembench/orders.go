package main

// The order families (mariadb, postgres, sqlite): B0–B2 on one database,
// each B1/B2 point against its own B0 in alternating slices; B3, many
// concurrent requests with one key; and the harness ceiling.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// runOrders is an order family: B0–B2 (runMain), then B3.
func (r *runner) runOrders(ctx context.Context, f *family) error {
	if err := r.runMain(ctx, f); err != nil {
		return err
	}
	return r.runB3(ctx, f)
}

// runMain is B0, B1 and B2 on one family over HTTP.
func (r *runner) runMain(ctx context.Context, f *family) error {
	fmt.Fprintf(os.Stderr, "== %s: B0 baseline, B1 first request, B2 replay\n", f.name)
	modes := r.opts.modes
	if r.opts.quick {
		modes = modes[:1] // quick: B2 in the first mode only
	}
	return r.measureB0B2(f.name, f.client, f.probe, f.httpFrontEnd, modes, []bool{true, false})
}

// frontEnd serves the order service with opts behind a front-end and
// returns a target that sends gen's requests there; with replays, every
// answer must be marked a replay.
type frontEnd func(opts orderservice.Options, gen generator, replays bool) (target, error)

// measureB0B2 is B0, B1 and B2 through fe, as family fam: at each
// concurrency, B1 in every mode, then B2 in each of replayModes with each
// of caches (the replay cache on or off), every point against a B0 run
// just before and after it (measureAgainst).
func (r *runner) measureB0B2(fam string, client *http.Client, probe func() map[string]float64, fe frontEnd, replayModes []idempotency.Mode, caches []bool) error {
	base, err := fe(orderservice.Options{}, genBaseline, false)
	if err != nil {
		return err
	}
	protected := func(cfg idempotency.Config) orderservice.Options {
		return orderservice.Options{Idempotency: true, Config: cfg}
	}
	first := map[idempotency.Mode]target{}
	for _, m := range r.opts.modes {
		if first[m], err = fe(protected(idempotency.Config{Mode: m}), genNewKey, false); err != nil {
			return err
		}
	}
	pool, err := createPool(client, first[r.opts.modes[0]], r.opts.poolSize, 16)
	if err != nil {
		return err
	}
	type replay struct {
		variant string
		t       target
	}
	var replays []replay
	for _, m := range replayModes {
		for _, cache := range caches {
			cfg := idempotency.Config{Mode: m}
			if !cache {
				cfg.ReplayCacheBytes = -1
			}
			t, err := fe(protected(cfg), genReplay(pool), true)
			if err != nil {
				return err
			}
			replays = append(replays, replay{modeName(m) + ", cache " + map[bool]string{true: "on", false: "off"}[cache], t})
		}
	}
	for _, c := range r.opts.concurrency {
		for _, m := range r.opts.modes {
			r.measureAgainst(client, probe, fam, c, 0, "B0", base, "B1", modeName(m), first[m])
		}
		for _, v := range replays {
			r.measureAgainst(client, probe, fam, c, 0, "B0", base, "B2", v.variant, v.t)
		}
	}
	return nil
}

// B3Result is one B3 variant: 64 concurrent requests with one key, repeated.
type B3Result struct {
	Family     string         `json:"family"`
	Variant    string         `json:"variant"`
	Requests   int            `json:"concurrent_requests"`
	Reps       int            `json:"repetitions"`
	TimesMS    []float64      `json:"times_ms"`
	P50        float64        `json:"p50_ms"`
	P99        float64        `json:"p99_ms"`
	Max        float64        `json:"max_ms"`
	Executions []int          `json:"executions"` // purchase_order rows per key
	Statuses   map[string]int `json:"statuses"`   // over all repetitions
	Orders     int            `json:"distinct_order_numbers_max"`
	OK         bool           `json:"exactly_once"`
}

// runB3 fires n concurrent requests with one key at a server, reps times:
// the time until all are answered, and the executions counted in
// purchase_order.
func (r *runner) runB3(ctx context.Context, f *family) error {
	fmt.Fprintf(os.Stderr, "== %s: B3 %d concurrent requests, one key\n", f.name, r.opts.b3Conc)
	type variant struct {
		name string
		cfg  idempotency.Config
	}
	var variants []variant
	for _, m := range r.opts.modes {
		variants = append(variants, variant{modeName(m), idempotency.Config{Mode: m}})
	}
	variants = append(variants, variant{"claim-first, InFlightWait 5s",
		idempotency.Config{Mode: idempotency.ModeClaimFirst, InFlightWait: 5 * time.Second}})
	client := newClient(r.opts.b3Conc)
	for _, v := range variants {
		t, err := f.firstTarget(v.cfg)
		if err != nil {
			return err
		}
		res := &B3Result{Family: f.name, Variant: v.name, Requests: r.opts.b3Conc, Reps: r.opts.b3Reps, Statuses: map[string]int{}, OK: true}
		for rep := range r.opts.b3Reps {
			elapsed, statuses, orders, key, err := fireOneKey(client, t, r.opts.b3Conc, rep)
			if err != nil {
				return fmt.Errorf("B3 %s: %w", v.name, err)
			}
			n, err := f.countOrders(ctx, "1", key)
			if err != nil {
				return fmt.Errorf("B3 %s: count: %w", v.name, err)
			}
			res.TimesMS = append(res.TimesMS, float64(elapsed)/1e6)
			res.Executions = append(res.Executions, n)
			for k, c := range statuses {
				res.Statuses[strconv.Itoa(k)] += c
			}
			res.Orders = max(res.Orders, orders)
			if n != 1 || orders > 1 || statuses[http.StatusCreated] == 0 {
				res.OK = false
				r.fail("B3 %s %s rep %d: %d executions (want exactly 1), %d distinct order numbers answered, statuses %v",
					f.name, v.name, rep, n, orders, statuses)
			}
		}
		sorted := slices.Clone(res.TimesMS)
		slices.Sort(sorted)
		res.P50, res.P99, res.Max = pctFloat(sorted, 50), pctFloat(sorted, 99), sorted[len(sorted)-1]
		r.b3 = append(r.b3, res)
		fmt.Fprintf(os.Stderr, "  %-8s B3 %-30s p50 %7.2f ms  p99 %7.2f ms  executions %v  statuses %v\n",
			f.name, v.name, res.P50, res.P99, compactInts(res.Executions), res.Statuses)
	}
	return nil
}

// fireOneKey sends n requests with one fresh key (user 1, one body) at once,
// each on its own pre-opened connection, and waits for all answers.
func fireOneKey(client *http.Client, t target, n, rep int) (time.Duration, map[int]int, int, string, error) {
	// Open n connections first, so that the timed burst measures the server.
	healthz := strings.TrimSuffix(t.url, "/orders") + "/healthz"
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if resp, err := client.Get(healthz); err == nil {
				_, _ = resp.Body.Read(make([]byte, 64))
				resp.Body.Close()
			}
		}()
	}
	close(gate)
	wg.Wait()

	w := newWorker(0)
	key := w.newKey()
	rq := request{key: key, user: 1, body: bodies[1][rep%numSKUs]}
	type answer struct {
		status  int
		orderNo string
		err     error
	}
	answers := make([]answer, n)
	ready := make(chan struct{})
	var started sync.WaitGroup
	for i := range n {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker(i)
			started.Done()
			<-ready
			status, err := w.do(client, t, rq)
			a := answer{status: status}
			if status == http.StatusCreated {
				a.orderNo = orderNo(w.buf.Bytes())
			} else if status == 0 {
				a.err = err
			}
			answers[i] = a
		}()
	}
	started.Wait()
	start := time.Now()
	close(ready)
	wg.Wait()
	elapsed := time.Since(start)
	statuses := map[int]int{}
	orders := map[string]bool{}
	for _, a := range answers {
		if a.err != nil {
			return 0, nil, 0, "", a.err
		}
		statuses[a.status]++
		if a.orderNo != "" {
			orders[a.orderNo] = true
		}
	}
	return elapsed, statuses, len(orders), key, nil
}

// orderNo pulls "order_no" out of a create answer without decoding it all.
func orderNo(body []byte) string {
	s := string(body)
	i := strings.Index(s, `"order_no":"`)
	if i < 0 {
		return ""
	}
	s = s[i+len(`"order_no":"`):]
	if j := strings.IndexByte(s, '"'); j >= 0 {
		return s[:j]
	}
	return ""
}

// cannedOrder is the size and shape of a create answer.
var cannedOrder = []byte(`{"order_no":"O20260101a1b2c3d4e5f60718","status":"CREATED","user_id":1,"sku_id":20001,"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000}` + "\n")

// runCeiling measures the harness alone: the load generator and net/http
// against a handler that reads the body and answers a fixed 201, no
// database. No point can go faster than this on this machine.
func (r *runner) runCeiling(ctx context.Context) error {
	fmt.Fprintf(os.Stderr, "== harness ceiling: net/http + load generator, no database\n")
	f := &family{name: "harness", client: newClient(64), probe: cpuProbe(nil)}
	defer f.close()
	url, err := f.serveHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/O20260101a1b2c3d4e5f60718")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(cannedOrder)
	}))
	if err != nil {
		return err
	}
	t := target{url: url, keyHeader: "Idempotency-Key", gen: genNewKey, wantStatus: http.StatusCreated}
	for _, c := range r.opts.concurrency {
		r.measure(f.client, f.probe, f.name, "ceiling", "no-op 201 handler", c, 0, t)
	}
	return nil
}

// ordersMarkdown writes the B0–B2 tables of the order families, HTTP and gRPC.
func (rep *Report) ordersMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	for _, fam := range []string{"mariadb", "postgres", "sqlite", "mariadb-grpc", "postgres-grpc"} {
		pts := rep.pointsOf(func(p *Point) bool { return p.Family == fam && (p.Bench == "B1" || p.Bench == "B2") })
		if len(pts) == 0 {
			continue
		}
		w("## B0–B2 on %s\n\n", map[string]string{"mariadb": "MariaDB", "postgres": "PostgreSQL", "sqlite": "SQLite",
			"mariadb-grpc": "MariaDB over gRPC", "postgres-grpc": "PostgreSQL over gRPC"}[fam])
		if strings.HasSuffix(fam, "-grpc") {
			w("The gRPC front-end (module grpc's interceptor, examples/grpcserver/ordergrpc) over the same database: B0 is CreateOrder without the interceptor in a plain transaction, B1 a new key per call through the interceptor, B2 a replay of a completed key (the replay cache on), each against B0 in alternating slices. Calls go over 4 HTTP/2 connections shared by the workers, as gRPC clients share them; every answer is checked (a replay marked idempotent-replayed and byte-identical, as a deterministic proto encoding, to the first). Targets (issue 23) at concurrency 16: single-phase B1/B0 ≥ 0.80, replay P99 ≤ 0.20 × B0's.\n\n")
		}
		rep.table(b, fam, pts, true)
	}
}

// b3Markdown writes the B3 table, if B3 ran.
func (rep *Report) b3Markdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(rep.B3) > 0 {
		w("## B3: %d concurrent requests with one key\n\n", rep.B3[0].Requests)
		w("Time from releasing all requests (each on its own open connection) until the last answer; executions are purchase_order rows for the key, counted after every repetition (must be exactly 1).\n\n")
		w("| family | variant | reps | P50 ms | P99 ms | max ms | executions | answers (all reps) | exactly once |\n|---|---|---:|---:|---:|---:|---|---|---|\n")
		for _, r := range rep.B3 {
			var st []string
			for k, v := range r.Statuses {
				st = append(st, fmt.Sprintf("%s×%d", k, v))
			}
			slices.Sort(st)
			ok := "yes"
			if !r.OK {
				ok = "**NO**"
			}
			w("| %s | %s | %d | %.1f | %.1f | %.1f | %s | %s | %s |\n", r.Family, r.Variant, r.Reps, r.P50, r.P99, r.Max,
				compactInts(r.Executions), strings.Join(st, " "), ok)
		}
		w("\n")
	}
}
