package main

// Points: what one measurement yields, and how the slices and runs of one
// are joined into the point the report shows.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
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

// mergeRuns joins the runs of each label: work over the summed seconds,
// each run's baseline weighted by its seconds, the statuses summed, and the
// slowest and fastest run's rate kept (run_rps_min, run_rps_max).
func mergeRuns(seq []*Point) []*Point {
	var order []string
	by := map[string]*Point{}
	for _, p := range seq {
		m := by[p.label()]
		if m == nil {
			cp := *p
			cp.Statuses, cp.Server = map[string]int{}, nil
			cp.BaselineRPS, cp.Requests, cp.Errors, cp.Seconds = 0, 0, 0, 0
			m = &cp
			by[p.label()] = m
			order = append(order, p.label())
		}
		for k, v := range p.Statuses {
			m.Statuses[k] += v
		}
		if m.Server == nil {
			m.Server = map[string]float64{"run_rps_min": p.RPS, "run_rps_max": p.RPS}
		}
		m.Server["run_rps_min"] = min(m.Server["run_rps_min"], p.RPS)
		m.Server["run_rps_max"] = max(m.Server["run_rps_max"], p.RPS)
		m.Requests += p.Requests
		m.Errors += p.Errors
		if m.FirstError == "" {
			m.FirstError = p.FirstError
		}
		m.Seconds += p.Seconds
		if p.BaselineRPS > 0 {
			m.BaselineRPS += p.BaselineRPS * p.Seconds
		}
	}
	out := make([]*Point, 0, len(order))
	for _, l := range order {
		m := by[l]
		m.RPS = float64(m.Requests) / m.Seconds
		m.BaselineRPS /= m.Seconds
		out = append(out, m)
	}
	return out
}

func fillLatency(p *Point, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	p.P50, p.P99, p.P999 = percentile(lat, 50), percentile(lat, 99), percentile(lat, 99.9)
	p.Mean = meanMS(lat)
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

// KindStat is one kind of request within a mixed point.
type KindStat struct {
	Requests int     `json:"requests"`
	RPS      float64 `json:"rps"` // answers of this kind per second of the window
	// EquivRPS is concurrency / mean latency: by Little's law the
	// throughput of a closed loop sending only this kind at the latencies
	// it had in the mix. Over the bare create's (its own concurrency /
	// mean latency) it is the kind's throughput ratio.
	EquivRPS float64 `json:"equiv_rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Mean     float64 `json:"mean_ms"`
}

func kindStat(sorted []time.Duration, conc int, seconds float64) *KindStat {
	k := &KindStat{Requests: len(sorted)}
	if len(sorted) == 0 {
		return k
	}
	k.Mean = meanMS(sorted)
	k.RPS = float64(len(sorted)) / seconds
	k.EquivRPS = float64(conc) / (k.Mean / 1e3)
	k.P50, k.P99 = percentile(sorted, 50), percentile(sorted, 99)
	return k
}

// meanMS is the mean of durations, in ms.
func meanMS(lat []time.Duration) float64 {
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return float64(sum) / float64(len(lat)) / 1e6
}

// nearestRank is the index of the nearest-rank percentile p of n sorted
// values (n > 0).
func nearestRank(n int, p float64) int {
	return max(0, min(int(p/100*float64(n)+0.999999)-1, n-1))
}

// percentile is the nearest-rank percentile of sorted durations, in ms.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[nearestRank(len(sorted), p)]) / 1e6
}

func pctFloat(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[nearestRank(len(sorted), p)]
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

func humanCount(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.FormatInt(n/1_000_000, 10) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.FormatInt(n/1000, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}
