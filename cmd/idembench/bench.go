package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
)

// Point is one measured load point.
type Point struct {
	Seq         int            `json:"seq"` // run order, across the whole run
	Family      string         `json:"family"`
	Bench       string         `json:"bench"` // B0, B1, B2, B4, B5
	Variant     string         `json:"variant"`
	Concurrency int            `json:"concurrency"`
	Records     int64          `json:"existing_records"`
	Requests    int64          `json:"requests"`
	Errors      int64          `json:"errors"`
	Statuses    map[string]int `json:"statuses"`
	FirstError  string         `json:"first_error,omitempty"`
	Seconds     float64        `json:"window_seconds"`
	RPS         float64        `json:"rps"`
	P50         float64        `json:"p50_ms"`
	P99         float64        `json:"p99_ms"`
	P999        float64        `json:"p999_ms"`
	Mean        float64        `json:"mean_ms"`
	Max         float64        `json:"max_ms"`
	// Baseline* are the mean of the nearest runs of the reference point
	// (B0, or Fiber's for ours) before and after this one, in the same
	// family at the same concurrency: the fair denominator on a noisy
	// machine.
	Baseline    string             `json:"baseline,omitempty"`
	BaselineRPS float64            `json:"baseline_rps,omitempty"`
	BaselineP99 float64            `json:"baseline_p99_ms,omitempty"`
	Server      map[string]float64 `json:"server,omitempty"` // per-request counters and CPU %

	// Kinds is a mixed point's latency by request kind (the fleet family).
	Kinds map[string]*KindStat `json:"kinds,omitempty"`

	lat     []time.Duration
	kindLat map[string][]time.Duration
}

func (p *Point) label() string {
	if p.Variant == "" {
		return p.Bench
	}
	return p.Bench + " " + p.Variant
}

// errorRate is the share of requests that failed their check.
func (p *Point) errorRate() float64 {
	if p.Requests == 0 {
		return 1
	}
	return float64(p.Errors) / float64(p.Requests)
}

// runner holds the settings and everything measured.
type runner struct {
	opts     options
	points   []*Point
	b3       []*B3Result
	b4loads  []LoadTiming
	notes    []string
	failures []string // correctness failures: the run exits non-zero
	cluster  *ClusterResult
	mu       sync.Mutex
}

func (r *runner) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, msg)
	fmt.Fprintln(os.Stderr, "note:", msg)
}

func (r *runner) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.failures = append(r.failures, msg)
	fmt.Fprintln(os.Stderr, "FAIL:", msg)
}

// measure runs one load point and records it.
func (r *runner) measure(client *http.Client, probe func() map[string]float64, family, bench, variant string, conc int, records int64, t target) *Point {
	return r.record(r.sample(client, probe, family, bench, variant, conc, records, t, r.opts.warmup, r.opts.duration))
}

// sample runs one load window and returns it unrecorded.
func (r *runner) sample(client *http.Client, probe func() map[string]float64, family, bench, variant string, conc int, records int64, t target, warmup, window time.Duration) *Point {
	stopProfile := r.startProfile(family, bench+" "+variant, conc, records)
	s := runLoad(client, t, conc, warmup, window, probe)
	stopProfile()
	p := &Point{
		Family: family, Bench: bench, Variant: variant, Concurrency: conc, Records: records,
		Requests: s.requests, Errors: s.errors, FirstError: s.firstErr, Seconds: s.window.Seconds(),
		Statuses: map[string]int{}, Server: s.probe, lat: s.lat, kindLat: s.kindLat,
	}
	for k, v := range s.statuses {
		p.Statuses[strconv.Itoa(k)] = v
	}
	p.RPS = float64(len(s.lat)) / s.window.Seconds()
	fillLatency(p, p.lat) // runLoad sorted them
	return p
}

// record numbers, prints and keeps a point, and fails the run when too many
// of its answers failed their check.
func (r *runner) record(p *Point) *Point {
	p.Seq = len(r.points) + 1
	r.points = append(r.points, p)
	fmt.Fprintf(os.Stderr, "  %-8s %-34s c=%-3d %8.0f req/s  p50 %7.2f ms  p99 %7.2f ms  p99.9 %7.2f ms  err %d\n",
		p.Family, p.label(), p.Concurrency, p.RPS, p.P50, p.P99, p.P999, p.Errors)
	if p.Errors > 0 {
		fmt.Fprintf(os.Stderr, "    first error: %s\n", p.FirstError)
	}
	if p.errorRate() > r.opts.maxErrorRate {
		r.fail("%s %s c=%d: %d of %d requests failed their check (first: %s)",
			p.Family, p.label(), p.Concurrency, p.Errors, p.Requests, p.FirstError)
	}
	return p
}

// mergePoints joins the slices of one point: requests over the summed
// windows, percentiles over all latencies, server counters weighted by each
// slice's requests.
func mergePoints(ps []*Point) *Point {
	if len(ps) == 1 {
		return ps[0]
	}
	m := &Point{Family: ps[0].Family, Bench: ps[0].Bench, Variant: ps[0].Variant, Concurrency: ps[0].Concurrency,
		Records: ps[0].Records, Statuses: map[string]int{}, Server: map[string]float64{}}
	for _, p := range ps {
		m.Requests += p.Requests
		m.Errors += p.Errors
		m.Seconds += p.Seconds
		if m.FirstError == "" {
			m.FirstError = p.FirstError
		}
		for k, v := range p.Statuses {
			m.Statuses[k] += v
		}
		m.lat = append(m.lat, p.lat...)
		for k, l := range p.kindLat {
			if m.kindLat == nil {
				m.kindLat = map[string][]time.Duration{}
			}
			m.kindLat[k] = append(m.kindLat[k], l...)
		}
	}
	for _, l := range m.kindLat {
		slices.Sort(l)
	}
	// cpu_* are shares of a core over the window: weighted by time. The
	// rest are per request: weighted by requests. A slice without a value
	// (no request answered) takes no weight.
	weight := map[string]float64{}
	for _, p := range ps {
		for k, v := range p.Server {
			w := float64(p.Requests)
			if strings.HasPrefix(k, "cpu_") && !strings.HasSuffix(k, "_per_req") {
				w = p.Seconds
			}
			m.Server[k] += v * w
			weight[k] += w
		}
	}
	for k, w := range weight {
		if w > 0 {
			m.Server[k] /= w
		}
	}
	m.RPS = float64(len(m.lat)) / m.Seconds
	slices.Sort(m.lat)
	fillLatency(m, m.lat)
	return m
}

func fillLatency(p *Point, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	p.P50, p.P99, p.P999 = percentile(lat, 50), percentile(lat, 99), percentile(lat, 99.9)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	p.Mean = float64(sum) / float64(len(lat)) / 1e6
	p.Max = float64(lat[len(lat)-1]) / 1e6
}

// setBaselines fills Baseline* of every point in seq whose reference is
// ref(p) (a bench+variant label), from the nearest reference runs before and
// after it.
func setBaselines(seq []*Point, ref func(p *Point) string) {
	for i, p := range seq {
		want := ref(p)
		if want == "" {
			continue
		}
		var found []*Point
		for j := i - 1; j >= 0; j-- {
			if seq[j].label() == want {
				found = append(found, seq[j])
				break
			}
		}
		for j := i + 1; j < len(seq); j++ {
			if seq[j].label() == want {
				found = append(found, seq[j])
				break
			}
		}
		if len(found) == 0 {
			continue
		}
		p.Baseline = want
		for _, b := range found {
			p.BaselineRPS += b.RPS / float64(len(found))
			p.BaselineP99 += b.P99 / float64(len(found))
		}
	}
}

func modeName(m idempotency.Mode) string { return m.String() }

func parseMode(s string) (idempotency.Mode, error) {
	return idempotency.ParseMode(strings.TrimSpace(s))
}

// runMain is B0, B1 and B2 on one family: at each concurrency, every B1 and
// B2 variant, with a B0 run between them so that every ratio has a baseline
// measured just before and just after.
func (r *runner) runMain(ctx context.Context, f *family) error {
	fmt.Fprintf(os.Stderr, "== %s: B0 baseline, B1 first request, B2 replay\n", f.name)
	base, err := f.baselineTarget()
	if err != nil {
		return err
	}
	first := map[idempotency.Mode]target{}
	for _, m := range r.opts.modes {
		if first[m], err = f.firstTarget(idempotency.Config{Mode: m}); err != nil {
			return err
		}
	}
	pool, err := createPool(f.client, first[idempotency.ModeClaimFirst], r.opts.poolSize, 16)
	if err != nil {
		return err
	}
	type replayVariant struct {
		mode  idempotency.Mode
		cache bool
		t     target
	}
	var replays []replayVariant
	for i, m := range r.opts.modes {
		for _, cache := range []bool{true, false} {
			if r.opts.quick && i > 0 {
				continue // quick: B2 in the first mode only
			}
			cfg := idempotency.Config{Mode: m}
			if !cache {
				cfg.ReplayCacheBytes = -1
			}
			t, err := f.replayTarget(cfg, pool)
			if err != nil {
				return err
			}
			replays = append(replays, replayVariant{m, cache, t})
		}
	}
	for _, c := range r.opts.concurrency {
		for _, m := range r.opts.modes {
			r.measureAgainst(f.client, f.probe, f.name, c, 0, "B0", base, "B1", modeName(m), first[m])
		}
		for _, v := range replays {
			variant := modeName(v.mode) + ", cache " + map[bool]string{true: "on", false: "off"}[v.cache]
			r.measureAgainst(f.client, f.probe, f.name, c, 0, "B0", base, "B2", variant, v.t)
		}
	}
	return nil
}

// measureAgainst measures a B1 or B2 point and its B0 baseline in
// alternating slices, B0 first and last (B0 B1 B0 B1 … B0), splitting the
// window between them: a slow spell of a noisy machine then falls on both
// sides of the ratio. The slices of each side are merged into one point.
func (r *runner) measureAgainst(client *http.Client, probe func() map[string]float64, family string, conc int, records int64, baseBench string, base target, bench, variant string, t target) {
	r.measureAgainstFor(r.opts.duration, r.opts.slices, client, probe, family, conc, records, baseBench, base, bench, variant, t)
}

// measureAgainstFor is measureAgainst with its own window and slice count.
func (r *runner) measureAgainstFor(window time.Duration, slices int, client *http.Client, probe func() map[string]float64, family string, conc int, records int64, baseBench string, base target, bench, variant string, t target) {
	n := max(slices, 1)
	slice := window / time.Duration(n)
	var b0s, bs []*Point
	for i := range n {
		warmup := r.opts.warmup
		if i > 0 {
			warmup = min(warmup, 200*time.Millisecond) // connections are warm
		}
		b0s = append(b0s, r.sample(client, probe, family, baseBench, "", conc, records, base, warmup, slice))
		bs = append(bs, r.sample(client, probe, family, bench, variant, conc, records, t, warmup, slice))
	}
	b0s = append(b0s, r.sample(client, probe, family, baseBench, "", conc, records, base, 200*time.Millisecond, slice))
	p0, p := r.record(mergePoints(b0s)), r.record(mergePoints(bs))
	p.Baseline, p.BaselineRPS, p.BaselineP99 = baseBench, p0.RPS, p0.P99
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

func pctFloat(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

func compactInts(xs []int) string {
	counts := map[int]int{}
	for _, x := range xs {
		counts[x]++
	}
	var parts []string
	keys := make([]int, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%d", counts[k], k))
	}
	return strings.Join(parts, " ")
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

// startProfile starts a CPU profile of the next point if -cpuprofile is set.
func (r *runner) startProfile(family, label string, conc int, records int64) func() {
	if r.opts.profileDir == "" {
		return func() {}
	}
	name := fmt.Sprintf("%02d-%s-%s-c%d", len(r.points)+1, family, label, conc)
	if records > 0 {
		name += "-" + humanCount(records)
	}
	name = strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			return c
		}
		return '_'
	}, name)
	if err := os.MkdirAll(r.opts.profileDir, 0o755); err != nil {
		r.note("cpuprofile: %v", err)
		return func() {}
	}
	f, err := os.Create(filepath.Join(r.opts.profileDir, name+".pprof"))
	if err != nil {
		r.note("cpuprofile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		r.note("cpuprofile: %v", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
