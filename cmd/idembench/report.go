package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is everything a run writes.
type Report struct {
	Command    string         `json:"command"`
	Machine    Machine        `json:"machine"`
	Options    map[string]any `json:"options"`
	Elapsed    float64        `json:"elapsed_seconds"`
	Phases     []Phase        `json:"phases"`
	Points     []*Point       `json:"points"`
	B0         []*Point       `json:"b0_aggregated"` // per family and concurrency, all B0 runs merged
	B3         []*B3Result    `json:"b3"`
	B4Loads    []LoadTiming   `json:"b4_loads"`
	B4Purges   []PurgeTiming  `json:"b4_purges,omitempty"`
	Ratios     []Ratio        `json:"ratios"`
	GoBench    []GoBench      `json:"go_benchmarks"`
	GoBenchCmd string         `json:"go_benchmarks_command"`
	Fiber      []string       `json:"fiber_semantic_differences"`
	Notes      []string       `json:"notes"`
	Failures   []string       `json:"correctness_failures"`
	Errors     []string       `json:"errors"`
	Cluster    *ClusterResult `json:"cluster,omitempty"`
	// Sources are the runs a merged report (-merge) was made of, newest
	// last, and Appendices the sections written by hand that it keeps
	// (merge.go).
	Sources    []Source   `json:"sources,omitempty"`
	Appendices []Appendix `json:"appendices,omitempty"`

	goBenchOut string
}

// Phase is how long one part of the run took.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Ratio is one derived number the report calls out.
type Ratio struct {
	Name        string  `json:"name"`
	Family      string  `json:"family"`
	Concurrency int     `json:"concurrency"`
	Value       float64 `json:"value"`
	Detail      string  `json:"detail"`
	Headline    bool    `json:"headline"`
}

const headlineConc = 16

// headlineFamilies are the families whose B1/B0 and B2/B0 P99 ratios are
// headlines, side by side, with their column titles.
var headlineFamilies = map[string]string{
	"mariadb": "MariaDB", "postgres": "PostgreSQL",
	"mariadb-grpc": "MariaDB over gRPC", "postgres-grpc": "PostgreSQL over gRPC",
}

// noisyCPU is the CPU (in % of one core) that other processes may use during
// a point before the report marks it noisy (†).
const noisyCPU = 25

func (rep *Report) fill(r *runner) {
	rep.Points = r.points
	rep.B3 = r.b3
	rep.B4Loads = r.b4loads
	rep.B4Purges = r.b4purges
	rep.Notes = r.notes
	rep.Failures = r.failures
	rep.Fiber = fiberDifferences
	rep.B0 = aggregateB0(r.points)
	rep.Ratios = computeRatios(r.points, rep.B0)
	rep.Cluster = r.cluster
}

// aggregateB0 merges every B0 run of a family and concurrency into one row:
// the mean throughput and the percentiles of all their latencies.
func aggregateB0(points []*Point) []*Point {
	var out []*Point
	groups := map[string]*Point{}
	var lat = map[string][]time.Duration{}
	var runs = map[string]int{}
	for _, p := range points {
		if p.Bench != "B0" {
			continue
		}
		k := fmt.Sprintf("%s/%d", p.Family, p.Concurrency)
		g := groups[k]
		if g == nil {
			g = &Point{Family: p.Family, Bench: "B0", Concurrency: p.Concurrency, Statuses: map[string]int{}, Server: map[string]float64{}}
			groups[k] = g
			out = append(out, g)
		}
		runs[k]++
		g.Requests += p.Requests
		g.Errors += p.Errors
		g.Seconds += p.Seconds
		g.RPS += p.RPS
		for s, n := range p.Statuses {
			g.Statuses[s] += n
		}
		for s, v := range p.Server {
			g.Server[s] += v
		}
		lat[k] = append(lat[k], p.lat...)
	}
	for k, g := range groups {
		n := float64(runs[k])
		g.RPS /= n
		for s := range g.Server {
			g.Server[s] /= n
		}
		g.Variant = fmt.Sprintf("mean of %d runs", runs[k])
		l := lat[k]
		slices.Sort(l)
		fillLatency(g, l)
	}
	return out
}

func computeRatios(points []*Point, b0 []*Point) []Ratio {
	var out []Ratio
	for _, p := range points {
		headline := headlineFamilies[p.Family] != "" && p.Concurrency == headlineConc
		switch {
		case p.Bench == "B1" && p.BaselineRPS > 0:
			out = append(out, thrRatio("B1/B0 throughput, "+p.Variant, p.Family, p, headline))
		case p.Bench == "B2" && p.BaselineRPS > 0:
			out = append(out, p99Ratio("B2/B0 P99, "+p.Variant, p.Family, p, headline), thrRatio("B2/B0 throughput, "+p.Variant, p.Family, p, false))
		case p.Bench == "SW" && p.BaselineRPS > 0:
			out = append(out, thrRatio("sync-wait/no-sync-wait replay throughput (cache off, other node)", p.Family, p, false),
				p99Ratio("sync-wait/no-sync-wait replay P99 (cache off, other node)", p.Family, p, false))
		case p.Bench == "B5" && p.BaselineRPS > 0:
			what := "B1 first request"
			if strings.Contains(p.Variant, "B2") {
				what = "B2 replay"
			}
			out = append(out, thrRatio("ours/Fiber throughput, "+what, "fiber", p, p.Concurrency == headlineConc), p99Ratio("ours/Fiber P99, "+what, "fiber", p, false))
		}
	}
	// B4: new keys during a purge against the same without one.
	for _, p := range points {
		if p.Bench == "B4:P1" && p.BaselineRPS > 0 {
			name := fmt.Sprintf("B4 new keys (%s) during a purge at %s records, over the same without one", p.Variant, humanCount(p.Records))
			out = append(out, thrRatio(name+": throughput", "mariadb", p, true), p99Ratio(name+": P99", "mariadb", p, true))
		}
	}
	// B4: the largest level against the empty one.
	var b4Labels []string
	for _, p := range points {
		if strings.HasPrefix(p.Bench, "B4:") && p.Bench != "B4:B0" && !slices.Contains(b4Labels, p.label()) {
			b4Labels = append(b4Labels, p.label())
		}
	}
	for _, label := range b4Labels {
		var empty, large *Point
		for _, p := range points {
			if p.label() != label {
				continue
			}
			if empty == nil || p.Records < empty.Records {
				empty = p
			}
			if large == nil || p.Records > large.Records {
				large = p
			}
		}
		if empty == nil || large == nil || empty == large {
			continue
		}
		name := strings.TrimPrefix(label, "B4:")
		lvl := fmt.Sprintf("%s/%s records", humanCount(large.Records), humanCount(empty.Records))
		normalized := large.BaselineRPS > 0 && empty.BaselineRPS > 0
		if normalized {
			// Levels are minutes apart: compare each through its own B0.
			out = append(out, overOwnB0("B4 "+name+" throughput "+lvl+" (each over its own B0)", "B4 "+name+" P99 "+lvl+" (each over its own B0)",
				large, empty, "", true)...)
		}
		raw := &Point{Concurrency: large.Concurrency, RPS: large.RPS, BaselineRPS: empty.RPS, P99: large.P99, BaselineP99: empty.P99}
		out = append(out, thrRatio("B4 "+name+" throughput "+lvl+" (raw)", "mariadb", raw, !normalized),
			p99Ratio("B4 "+name+" P99 "+lvl+" (raw)", "mariadb", raw, !normalized))
	}
	// B4: new keys of both kinds at each level (keys.go).
	out = append(out, keyKindRatios(points)...)
	return out
}

// overOwnB0 compares a with b (on MariaDB), each through its own baseline
// as they were measured apart: (a / a's B0) / (b / b's B0), in throughput
// (named thrName, its detail followed by extra) and in P99.
func overOwnB0(thrName, p99Name string, a, b *Point, extra string, headline bool) []Ratio {
	return []Ratio{{
		Name: thrName, Family: "mariadb", Concurrency: a.Concurrency,
		Value:  (a.RPS / a.BaselineRPS) / (b.RPS / b.BaselineRPS),
		Detail: fmt.Sprintf("(%.0f/%.0f) / (%.0f/%.0f) req/s", a.RPS, a.BaselineRPS, b.RPS, b.BaselineRPS) + extra, Headline: headline,
	}, {
		Name: p99Name, Family: "mariadb", Concurrency: a.Concurrency,
		Value:  (a.P99 / a.BaselineP99) / (b.P99 / b.BaselineP99),
		Detail: fmt.Sprintf("(%.2f/%.2f) / (%.2f/%.2f) ms", a.P99, a.BaselineP99, b.P99, b.BaselineP99), Headline: headline,
	}}
}

// thrRatio is p's throughput over its baseline's.
func thrRatio(name, family string, p *Point, headline bool) Ratio {
	return Ratio{Name: name, Family: family, Concurrency: p.Concurrency, Value: p.RPS / p.BaselineRPS,
		Detail: fmt.Sprintf("%.0f / %.0f req/s", p.RPS, p.BaselineRPS), Headline: headline}
}

// p99Ratio is p's P99 over its baseline's.
func p99Ratio(name, family string, p *Point, headline bool) Ratio {
	return Ratio{Name: name, Family: family, Concurrency: p.Concurrency, Value: p.P99 / p.BaselineP99,
		Detail: fmt.Sprintf("%.2f / %.2f ms", p.P99, p.BaselineP99), Headline: headline}
}

func (rep *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.md"), []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	return nil
}
