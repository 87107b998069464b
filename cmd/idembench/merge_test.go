package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mergeBundle is a report directory holding an earlier full run.
type mergeBundle struct {
	dir string
	old *Report
}

func setupMerge(t *testing.T, handWritten string) mergeBundle {
	t.Helper()
	old := &Report{
		Command: "cd cmd/idembench && go run . -out ../../docs",
		Machine: Machine{Date: "2026-11-30 05:17 UTC", Nproc: "2", CPUModel: "AMD EPYC"},
		Options: map[string]any{"slices": 5, "duration": "10s"},
		Phases:  []Phase{{Name: "go benchmarks"}, {Name: "mariadb"}, {Name: "b4"}},
		Points: []*Point{
			{Family: "mariadb", Bench: "B0", Concurrency: 16, RPS: 1000, P99: 20},
			{Family: "mariadb", Bench: "B1", Variant: "single-phase", Concurrency: 16, RPS: 830, BaselineRPS: 1000, P99: 25, BaselineP99: 20},
			{Family: "mariadb", Bench: "B4:B1", Variant: "claim-first", Concurrency: 16, Records: 1000, RPS: 900},
		},
		B0:      []*Point{{Family: "mariadb", Bench: "B0", Variant: "mean of 2 runs", Concurrency: 16, RPS: 1000, P99: 20}},
		B3:      []*B3Result{{Family: "mariadb", Variant: "claim-first", OK: true}},
		B4Loads: []LoadTiming{{From: 0, To: 1000}},
		GoBench: []GoBench{{Name: "BenchmarkX-2", Line: "BenchmarkX-2 1 1 ns/op"}},
		Notes:   []string{"an old note"},
	}
	dir := t.TempDir()
	js, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "benchmarks.md"), []byte(old.markdown()+handWritten), 0o644); err != nil {
		t.Fatal(err)
	}
	return mergeBundle{dir: dir, old: old}
}

// postgresRun is a run that measured the postgres family only.
func postgresRun() *Report {
	return &Report{
		Command: "cd cmd/idembench && go run . -mariadb=false -merge",
		Machine: Machine{Date: "2026-12-01 16:00 UTC", Nproc: "2", CPUModel: "Intel Xeon"},
		Options: map[string]any{"slices": 5, "duration": "10s"},
		Phases:  []Phase{{Name: "postgres", Seconds: 480}},
		Points: []*Point{
			{Family: "postgres", Bench: "B0", Concurrency: 16, RPS: 800, P99: 30},
			{Family: "postgres", Bench: "B1", Variant: "single-phase", Concurrency: 16, RPS: 700, BaselineRPS: 800, P99: 35, BaselineP99: 30},
		},
		B0:    []*Point{{Family: "postgres", Bench: "B0", Variant: "mean of 2 runs", Concurrency: 16, RPS: 800, P99: 30}},
		B3:    []*B3Result{{Family: "postgres", Variant: "claim-first", OK: true}},
		Notes: []string{"a new note"},
	}
}

func families(points []*Point) []string {
	var out []string
	for _, p := range points {
		out = append(out, p.Family+" "+p.label())
	}
	return out
}

func TestMerge_ReplacesMeasuredPartsKeepsTheRest(t *testing.T) {
	t.Parallel()
	b := setupMerge(t, "")
	rep := postgresRun()
	if err := rep.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	want := []string{"mariadb B0", "mariadb B1 single-phase", "postgres B0", "postgres B1 single-phase", "mariadb B4:B1 claim-first"}
	if got := families(rep.Points); !slices.Equal(got, want) {
		t.Fatalf("points %q, want %q (kept, in a full run's order)", got, want)
	}
	if len(rep.B0) != 2 || len(rep.B3) != 2 || len(rep.B4Loads) != 1 || len(rep.GoBench) != 1 {
		t.Fatalf("kept B0 %d, B3 %d, B4 loads %d, Go benchmarks %d; want 2, 2, 1, 1", len(rep.B0), len(rep.B3), len(rep.B4Loads), len(rep.GoBench))
	}
	var headlines []string
	for _, r := range rep.Ratios {
		if r.Headline {
			headlines = append(headlines, r.Family+" "+r.Name)
		}
	}
	if want := []string{"mariadb B1/B0 throughput, single-phase", "postgres B1/B0 throughput, single-phase"}; !slices.Equal(headlines, want) {
		t.Fatalf("headline ratios %q, want %q", headlines, want)
	}
	if len(rep.Sources) != 2 || !slices.Equal(rep.Sources[0].Parts, []string{"go benchmarks", "mariadb", "b4"}) ||
		!slices.Equal(rep.Sources[1].Parts, []string{"postgres"}) {
		t.Fatalf("sources %+v", rep.Sources)
	}
	if !slices.Equal(rep.Notes, []string{"an old note", "a new note"}) {
		t.Fatalf("notes %q", rep.Notes)
	}
	md := rep.markdown()
	for _, s := range []string{"This report merges 2 runs", "machine: as above but CPU AMD EPYC", "| ratio | MariaDB | from | PostgreSQL | from |", "## B0–B2 on PostgreSQL"} {
		if !strings.Contains(md, s) {
			t.Errorf("merged markdown lacks %q", s)
		}
	}
}

func TestMerge_AgainReplacesTheSameFamily(t *testing.T) {
	t.Parallel()
	b := setupMerge(t, "")
	first := postgresRun()
	if err := first.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	if err := first.write(b.dir); err != nil {
		t.Fatal(err)
	}
	second := postgresRun()
	second.Points[1].RPS = 790
	if err := second.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	var pg []*Point
	for _, p := range second.Points {
		if p.Family == "postgres" {
			pg = append(pg, p)
		}
	}
	if len(pg) != 2 || pg[1].RPS != 790 || len(second.Sources) != 2 {
		t.Fatalf("postgres points %v, sources %d: want the second run's 2 points and 2 sources", families(pg), len(second.Sources))
	}
}

func TestMerge_HandWrittenSectionsAreKeptUntilMeasured(t *testing.T) {
	t.Parallel()
	fleet := "## Fleet: three instances (appended by hand)\n\nMeasured separately:\n\n```sh\n## not a heading\n```\n"
	b := setupMerge(t, fleet)
	rep := postgresRun()
	if err := rep.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	if len(rep.Appendices) != 1 || rep.Appendices[0].Part != "fleet" || rep.Appendices[0].Markdown != strings.TrimRight(fleet, "\n") {
		t.Fatalf("appendices %+v, want the fleet section verbatim", rep.Appendices)
	}
	if !strings.Contains(rep.markdown(), fleet) {
		t.Fatal("merged markdown lacks the hand-written section")
	}
	if err := rep.write(b.dir); err != nil {
		t.Fatal(err)
	}

	// Kept across a further merge, not imported twice.
	again := postgresRun()
	if err := again.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	if len(again.Appendices) != 1 {
		t.Fatalf("appendices after a second merge: %d, want 1", len(again.Appendices))
	}
	if err := again.write(b.dir); err != nil {
		t.Fatal(err)
	}

	// A run that measures the fleet replaces it.
	fleetRun := &Report{Phases: []Phase{{Name: "fleet"}}, Options: map[string]any{},
		Points: []*Point{{Family: famFleet, Bench: "F", Variant: "claim-first, 5% retries", Concurrency: 16}}}
	if err := fleetRun.mergeInto(b.dir); err != nil {
		t.Fatal(err)
	}
	if len(fleetRun.Appendices) != 0 {
		t.Fatalf("appendices after a fleet run: %+v, want none", fleetRun.Appendices)
	}
}

func TestMerge_WithoutAnEarlierReport_WritesTheRunAlone(t *testing.T) {
	t.Parallel()
	rep := postgresRun()
	if err := rep.mergeInto(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if len(rep.Sources) != 0 || len(rep.Points) != 2 {
		t.Fatalf("sources %d, points %d; want the run alone", len(rep.Sources), len(rep.Points))
	}
}

func TestPartOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ family, bench, want string }{
		{"mariadb", "B1", "mariadb"},
		{"mariadb", "B4:B1", "b4"},
		{"postgres", "B0", "postgres"},
		{"harness", "ceiling", "harness ceiling"},
		{"galera-2i2n", "B1", "galera"},
		{famFleet, "F", "fleet"},
		{"fiber", "B5", "fiber"},
	} {
		if got := partOf(tc.family, tc.bench); got != tc.want {
			t.Errorf("partOf(%q, %q) = %q, want %q", tc.family, tc.bench, got, tc.want)
		}
	}
}

// A run written to a directory of its own merges later, measuring nothing:
// -from-json its benchmarks.json -merge -out the report.
func TestMerge_FromJSON_MergesASavedRun(t *testing.T) {
	t.Parallel()
	b := setupMerge(t, "")
	saved := filepath.Join(t.TempDir(), "benchmarks.json")
	js, err := json.Marshal(postgresRun())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saved, js, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"-from-json", saved, "-merge", "-out", b.dir}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var merged Report
	js, err = os.ReadFile(filepath.Join(b.dir, "benchmarks.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &merged); err != nil {
		t.Fatal(err)
	}
	want := []string{"mariadb B0", "mariadb B1 single-phase", "postgres B0", "postgres B1 single-phase", "mariadb B4:B1 claim-first"}
	if got := families(merged.Points); !slices.Equal(got, want) {
		t.Fatalf("points %q, want %q", got, want)
	}
	if len(merged.Sources) != 2 {
		t.Fatalf("sources %+v, want the old run and the saved one", merged.Sources)
	}

	// A merged report is not one run: merging it again would nest sources.
	if code := run([]string{"-from-json", filepath.Join(b.dir, "benchmarks.json"), "-merge", "-out", t.TempDir()}); code != 2 {
		t.Fatalf("merging a merged report: exit %d, want 2", code)
	}
}
