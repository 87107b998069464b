package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// A point and its baseline alternate slice by slice, the baseline first and
// last; only the first slice of each side warms up fully.
func TestAlternate_BaselineFirstAndLastFullWarmupOnlyFirst(t *testing.T) {
	t.Parallel()
	var calls []string
	side := func(name string, rps float64) sampler {
		return func(warmup, window time.Duration) *Point {
			calls = append(calls, fmt.Sprintf("%s %v %v", name, warmup, window))
			return &Point{Bench: name, Requests: int64(rps * window.Seconds()), Seconds: window.Seconds(),
				lat: []time.Duration{time.Millisecond}, Statuses: map[string]int{}}
		}
	}
	base, v := alternate(3, 3*time.Second, time.Second, side("B0", 100), side("B1", 50))
	want := []string{"B0 1s 1s", "B1 1s 1s", "B0 200ms 1s", "B1 200ms 1s", "B0 200ms 1s", "B1 200ms 1s", "B0 200ms 1s"}
	if !slices.Equal(calls, want) {
		t.Fatalf("slices %q, want %q", calls, want)
	}
	if base.Seconds != 4 || v.Seconds != 3 || base.Requests != 400 || v.Requests != 150 {
		t.Fatalf("merged: base %v s %d req, variant %v s %d req; want 4 s 400, 3 s 150", base.Seconds, base.Requests, v.Seconds, v.Requests)
	}
}

// fixed is a fixedRun that records its label in seq and returns a point of
// rps.
func fixed(seq *[]string, bench, variant string, rps float64) fixedRun {
	p := &Point{Bench: bench, Variant: variant}
	return fixedRun{label: p.label(), run: func() (*Point, error) {
		*seq = append(*seq, p.label())
		return &Point{Bench: bench, Variant: variant, Requests: int64(rps), Seconds: 1, RPS: rps,
			Statuses: map[string]int{"runs": 1}}, nil
	}}
}

// Rounds run every variant between two runs of the baseline, slice after
// slice, and merge each label's runs with the baseline runs around them.
func TestRounds_EachVariantBetweenBaselinesMergedByLabel(t *testing.T) {
	t.Parallel()
	var seq []string
	pts, err := rounds(2, fixed(&seq, "Q0", "", 100), []fixedRun{fixed(&seq, "Q1", "a", 80), fixed(&seq, "Q1", "b", 50)})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Q0", "Q1 a", "Q0", "Q1 b", "Q0", "Q1 a", "Q0", "Q1 b", "Q0"}
	if !slices.Equal(seq, want) {
		t.Fatalf("runs %q, want %q", seq, want)
	}
	var got []string
	for _, p := range pts {
		got = append(got, fmt.Sprintf("%s %.0f/%.0f runs=%d", p.label(), p.RPS, p.BaselineRPS, p.Statuses["runs"]))
	}
	if want := []string{"Q0 100/0 runs=5", "Q1 a 80/100 runs=2", "Q1 b 50/100 runs=2"}; !slices.Equal(got, want) {
		t.Fatalf("merged %q, want %q", got, want)
	}
}

// A run that fails stops the rounds with its error.
func TestRounds_StopsAtAFailedRun(t *testing.T) {
	t.Parallel()
	var seq []string
	boom := fixedRun{label: "Q1 x", run: func() (*Point, error) { return nil, errors.New("boom") }}
	if _, err := rounds(3, fixed(&seq, "Q0", "", 1), []fixedRun{boom}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err %v, want boom", err)
	}
	if len(seq) != 1 {
		t.Fatalf("runs after the failure: %q", seq)
	}
}

// Merged runs rate the work over the summed seconds, weigh each run's
// baseline by its seconds, sum statuses and errors, and keep the slowest
// and the fastest run.
func TestMergeRuns_WeighsRunsBySeconds(t *testing.T) {
	t.Parallel()
	m := mergeRuns([]*Point{
		{Bench: "W1", Requests: 100, Seconds: 1, RPS: 100, BaselineRPS: 200, Statuses: map[string]int{"doubles": 0}},
		{Bench: "W1", Requests: 100, Seconds: 3, RPS: 33, BaselineRPS: 100, Errors: 2, FirstError: "x", Statuses: map[string]int{"doubles": 1}},
	})
	if len(m) != 1 {
		t.Fatalf("%d points, want 1", len(m))
	}
	p := m[0]
	if p.RPS != 50 || p.BaselineRPS != 125 || p.Errors != 2 || p.FirstError != "x" || p.Statuses["doubles"] != 1 ||
		p.Server["run_rps_min"] != 33 || p.Server["run_rps_max"] != 100 {
		t.Fatalf("merged %+v (server %v)", p, p.Server)
	}
}

// Every profile gets a file of its own: a point's B0 slices before and
// after it, profiled before either is recorded, no longer share a name.
func TestStartProfile_EachProfileItsOwnFile(t *testing.T) {
	dir := t.TempDir()
	r := &runner{opts: options{profileDir: dir}}
	for range 3 {
		r.startProfile("mariadb", "B0", 16, 0)()
	}
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("%d files for 3 profiles: %v", len(files), files)
	}
}
