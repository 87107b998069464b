package main

// The runner every family shares: load windows (sample, measureAgainst,
// alternating a point with its baseline in slices) and fixed runs
// (rounds), each recorded with its correctness checked.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

// runner holds the settings and everything measured.
type runner struct {
	opts     options
	points   []*Point
	b3       []*B3Result
	b4loads  []LoadTiming
	b4purges []PurgeTiming
	notes    []string
	failures []string // correctness failures: the run exits non-zero
	cluster  *ClusterResult
	profiles int // CPU profiles written, which numbers their files
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

// measureAgainst measures a B1 or B2 point against its B0 baseline in
// alternating slices of the window (alternate), and records both.
func (r *runner) measureAgainst(client *http.Client, probe func() map[string]float64, family string, conc int, records int64, baseBench string, base target, bench, variant string, t target) (*Point, *Point) {
	return r.measureAgainstFor(r.opts.duration, r.opts.slices, client, probe, family, conc, records, baseBench, base, bench, variant, t)
}

// measureAgainstFor is measureAgainst with its own window and slice count.
func (r *runner) measureAgainstFor(window time.Duration, slices int, client *http.Client, probe func() map[string]float64, family string, conc int, records int64, baseBench string, base target, bench, variant string, t target) (*Point, *Point) {
	side := func(bench, variant string, t target) sampler {
		return func(warmup, window time.Duration) *Point {
			return r.sample(client, probe, family, bench, variant, conc, records, t, warmup, window)
		}
	}
	p0, p := alternate(slices, window, r.opts.warmup, side(baseBench, "", base), side(bench, variant, t))
	r.record(p0)
	r.record(p)
	p.Baseline, p.BaselineRPS, p.BaselineP99 = baseBench, p0.RPS, p0.P99
	return p0, p
}

// sampler measures one side of a comparison: a window after a warm-up.
type sampler func(warmup, window time.Duration) *Point

// alternate measures variant against base with window split into n
// slices for each, base first and last (B0 V B0 V … B0), so that a slow
// spell of a noisy machine falls on both sides of their ratio, and returns
// each side's slices merged, unrecorded. The first slice of each side warms up for
// warmup, the others for at most 200 ms (the connections are warm).
func alternate(n int, window, warmup time.Duration, base, variant sampler) (*Point, *Point) {
	n = max(n, 1)
	slice := window / time.Duration(n)
	short := min(warmup, 200*time.Millisecond)
	var bs, vs []*Point
	for i := range n {
		w := warmup
		if i > 0 {
			w = short
		}
		bs = append(bs, base(w, slice))
		vs = append(vs, variant(w, slice))
	}
	bs = append(bs, base(short, slice))
	return mergePoints(bs), mergePoints(vs)
}

// Fixed runs: the families that measure a fixed amount of work (the
// queue's messages, the webhook's events) rather than a window. The
// variants run one after another, each between two runs of the baseline,
// and again for every slice, so that a slow spell of the machine falls on
// both sides of a ratio.

// fixedRun is one run of a variant: its label (Point.label) and the run.
type fixedRun struct {
	label string
	run   func() (*Point, error)
}

// rounds runs base, then each variant followed by base, slices times
// (base V1 base V2 … base, V1 base …), sets every variant's baseline from
// the base runs nearest it, and returns the runs of each label merged, in
// the order of their first run.
func rounds(slices int, base fixedRun, variants []fixedRun) ([]*Point, error) {
	seq := make([]*Point, 0, 1+2*slices*len(variants))
	add := func(fr fixedRun) error {
		p, err := fr.run()
		if err != nil {
			return err
		}
		seq = append(seq, p)
		return nil
	}
	if err := add(base); err != nil {
		return nil, err
	}
	for range max(slices, 1) {
		for _, v := range variants {
			if err := add(v); err != nil {
				return nil, err
			}
			if err := add(base); err != nil {
				return nil, err
			}
		}
	}
	setBaselines(seq, func(p *Point) string {
		if p.label() == base.label {
			return ""
		}
		return base.label
	})
	return mergeRuns(seq), nil
}

func modeName(m idempotency.Mode) string { return m.String() }

func parseMode(s string) (idempotency.Mode, error) {
	return idempotency.ParseMode(strings.TrimSpace(s))
}

// startProfile starts a CPU profile of the next point if -cpuprofile is set.
func (r *runner) startProfile(family, label string, conc int, records int64) func() {
	if r.opts.profileDir == "" {
		return func() {}
	}
	// Numbered by profile, not by point: the B0 slices before and after a
	// point are profiled before either is recorded.
	r.profiles++
	name := fmt.Sprintf("%03d-%s-%s-c%d", r.profiles, family, label, conc)
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
