package main

// -merge: a run that measures some families updates a full report without
// re-running the rest. The families it measured replace theirs in -out's
// benchmarks.json; the others are kept with the command, machine and
// options of the run that measured them (Source); sections of benchmarks.md
// written by hand are kept verbatim (Appendix) until a run measures their
// family. benchmarks.md is rendered from the merged
// report.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Source is one run a merged report was made of: the parts it measured that
// the report still holds, and where and how it measured them.
type Source struct {
	Parts    []string       `json:"parts"`
	Command  string         `json:"command"`
	Machine  Machine        `json:"machine"`
	Options  map[string]any `json:"options"`
	Elapsed  float64        `json:"elapsed_seconds"`
	Phases   []Phase        `json:"phases"`
	Notes    []string       `json:"notes,omitempty"`
	Failures []string       `json:"correctness_failures,omitempty"`
	Errors   []string       `json:"errors,omitempty"`
}

// Appendix is a section of benchmarks.md written by hand (no run's points
// produce it), kept verbatim. Part, if set, is the part whose generated
// section replaces it once a run measures that part.
type Appendix struct {
	Part     string `json:"part,omitempty"`
	Heading  string `json:"heading"`
	Markdown string `json:"markdown"` // heading included
}

// partOrder is the order of the parts in a full run (the steps of run).
var partOrder = []string{"go benchmarks", "harness ceiling", "mariadb", "postgres", "sqlite", "fleet", "b4", "fiber", "queue", "webhook", "galera"}

// handPart maps the key of a hand-written section's heading (sectionKey) to
// the part whose generated section it stands for.
var handPart = map[string]string{"Cluster": "galera", "Fleet": "fleet"}

// partOf names the part (the step of run) that measures a point of family
// and bench. A family no step is known for is its own part.
func partOf(family, bench string) string {
	switch {
	case strings.HasPrefix(bench, "B4"):
		return "b4"
	case family == "harness":
		return "harness ceiling"
	case strings.HasPrefix(family, "galera-"):
		return "galera"
	case strings.HasPrefix(family, "fleet"):
		return "fleet"
	}
	return family
}

func partRank(part string) int {
	if i := slices.Index(partOrder, part); i >= 0 {
		return i
	}
	return len(partOrder)
}

// parts are the parts this report measured: the steps that ran, and the
// parts of what they produced.
func (rep *Report) parts() []string {
	var out []string
	add := func(p string) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, ph := range rep.Phases {
		add(ph.Name)
	}
	for _, p := range rep.Points {
		add(partOf(p.Family, p.Bench))
	}
	for _, b := range rep.B3 {
		add(partOf(b.Family, "B3"))
	}
	if len(rep.B4Loads) > 0 {
		add("b4")
	}
	if len(rep.GoBench) > 0 {
		add("go benchmarks")
	}
	if rep.Cluster != nil {
		add("galera")
	}
	slices.SortStableFunc(out, func(a, b string) int { return partRank(a) - partRank(b) })
	return out
}

// source describes this report's own run.
func (rep *Report) source() Source {
	return Source{Parts: rep.parts(), Command: rep.Command, Machine: rep.Machine, Options: rep.Options,
		Elapsed: rep.Elapsed, Phases: rep.Phases, Notes: rep.Notes, Failures: rep.Failures, Errors: rep.Errors}
}

// mergeInto merges the report in dir's benchmarks.json into this run's:
// what this run measured replaces the same parts there, the rest is kept.
// Sections of dir's benchmarks.md that the old report does not produce
// (written by hand) become appendices.
func (rep *Report) mergeInto(dir string) error {
	path := filepath.Join(dir, "benchmarks.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "idembench: -merge: no %s yet: writing this run alone\n", path)
		return nil
	}
	if err != nil {
		return err
	}
	var old Report
	if err := json.Unmarshal(b, &old); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if md, err := os.ReadFile(filepath.Join(dir, "benchmarks.md")); err == nil {
		old.Appendices = append(old.Appendices, handSections(string(md), old.markdown())...)
	}
	self := rep.source()
	replaced := map[string]bool{}
	for _, p := range self.Parts {
		replaced[p] = true
	}
	replacedPoint := func(p *Point) bool { return replaced[partOf(p.Family, p.Bench)] }
	byPart := func(a, b *Point) int {
		return partRank(partOf(a.Family, a.Bench)) - partRank(partOf(b.Family, b.Bench))
	}
	rep.Points = append(slices.DeleteFunc(old.Points, replacedPoint), rep.Points...)
	slices.SortStableFunc(rep.Points, byPart)
	rep.B0 = append(slices.DeleteFunc(old.B0, replacedPoint), rep.B0...)
	slices.SortStableFunc(rep.B0, byPart)
	rep.B3 = append(slices.DeleteFunc(old.B3, func(r *B3Result) bool { return replaced[partOf(r.Family, "B3")] }), rep.B3...)
	slices.SortStableFunc(rep.B3, func(a, b *B3Result) int { return partRank(a.Family) - partRank(b.Family) })
	if !replaced["b4"] {
		rep.B4Loads, rep.B4Purges = old.B4Loads, old.B4Purges
	}
	if !replaced["go benchmarks"] {
		rep.GoBench, rep.GoBenchCmd = old.GoBench, old.GoBenchCmd
	}
	if !replaced["galera"] {
		rep.Cluster = old.Cluster
	}
	rep.Ratios = computeRatios(rep.Points, rep.B0)

	sources := old.Sources
	if len(sources) == 0 {
		sources = []Source{old.source()}
	}
	rep.Sources = nil
	for _, s := range sources {
		s.Parts = slices.DeleteFunc(slices.Clone(s.Parts), func(p string) bool { return replaced[p] })
		if len(s.Parts) > 0 {
			rep.Sources = append(rep.Sources, s)
		}
	}
	rep.Sources = append(rep.Sources, self)
	// A run's notes, failures and errors stay while any of its parts does.
	rep.Notes, rep.Failures, rep.Errors = nil, nil, nil
	for _, s := range rep.Sources {
		rep.Notes = append(rep.Notes, s.Notes...)
		rep.Failures = append(rep.Failures, s.Failures...)
		rep.Errors = append(rep.Errors, s.Errors...)
	}
	rep.Appendices = nil
	for _, a := range old.Appendices {
		if a.Part == "" || !replaced[a.Part] {
			rep.Appendices = append(rep.Appendices, a)
		}
	}
	return nil
}

// section is one "## " section of a markdown document, heading included.
type section struct {
	heading, text string
}

// splitSections splits md at its "## " headings (outside code blocks); the
// text before the first heading is left out.
func splitSections(md string) []section {
	var out []section
	var cur *section
	var body strings.Builder
	flush := func() {
		if cur != nil {
			cur.text = strings.TrimRight(body.String(), "\n")
			out = append(out, *cur)
		}
		body.Reset()
	}
	fenced := false
	for _, line := range strings.SplitAfter(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if h, ok := strings.CutPrefix(line, "## "); ok && !fenced {
			flush()
			cur = &section{heading: strings.TrimSpace(h)}
		}
		body.WriteString(line)
	}
	flush()
	return out
}

// sectionKey is a heading up to its first ":" or " (": the part of a
// generated heading that does not change with the data.
func sectionKey(heading string) string {
	if i := strings.IndexAny(heading, ":("); i >= 0 {
		heading = heading[:i]
	}
	return strings.TrimSpace(heading)
}

// handSections returns the sections of md whose heading rendered does not
// have (by sectionKey): those written by hand.
func handSections(md, rendered string) []Appendix {
	generated := map[string]bool{}
	for _, s := range splitSections(rendered) {
		generated[sectionKey(s.heading)] = true
	}
	var out []Appendix
	for _, s := range splitSections(md) {
		if k := sectionKey(s.heading); !generated[k] {
			out = append(out, Appendix{Part: handPart[k], Heading: s.heading, Markdown: s.text})
		}
	}
	return out
}

// optionsOf is the settings of the run that measured part: in a merged
// report its source's, so that a family's section states how it was
// measured, not how the latest run was; otherwise this run's.
func (rep *Report) optionsOf(part string) map[string]any {
	for _, s := range rep.Sources {
		if slices.Contains(s.Parts, part) {
			return s.Options
		}
	}
	return rep.Options
}

// appendixMarkdown writes the appendices whose part no point stands for.
func (rep *Report) appendixMarkdown(b *strings.Builder) {
	for _, a := range rep.Appendices {
		if a.Part != "" && len(rep.pointsOf(func(p *Point) bool { return partOf(p.Family, p.Bench) == a.Part })) > 0 {
			continue
		}
		b.WriteString(strings.TrimRight(a.Markdown, "\n") + "\n\n")
	}
}

// sourcesMarkdown writes which run measured which parts of a merged report,
// newest first, with what differs from the newest run's machine and
// settings.
func (rep *Report) sourcesMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("This report merges %d runs (`-merge`: a later run replaces the parts it measured, and keeps the others):\n\n", len(rep.Sources))
	for i := len(rep.Sources) - 1; i >= 0; i-- {
		s := rep.Sources[i]
		var phases []string
		for _, p := range s.Phases {
			if slices.Contains(s.Parts, p.Name) {
				phases = append(phases, fmt.Sprintf("%s %.0f s", p.Name, p.Seconds))
			}
		}
		w("- **%s**: `%s`, %s (%s)", strings.Join(s.Parts, ", "), s.Command, s.Machine.Date, strings.Join(phases, ", "))
		if d := machineDiff(rep.Machine, s.Machine); d != "" {
			w("; machine: %s", d)
		}
		if d := optionsDiff(rep.Options, s.Options); d != "" {
			w("; settings: %s", d)
		}
		w(".\n")
	}
	var hand []string
	for _, a := range rep.Appendices {
		hand = append(hand, "\""+a.Heading+"\"")
	}
	if len(hand) > 0 {
		w("\nSections written by hand are kept verbatim from the earlier report until a run measures their family: %s.\n", strings.Join(hand, ", "))
	}
	w("\n")
}

// machineDiff lists where machine m differs from the report's (date aside).
func machineDiff(report, m Machine) string {
	var out []string
	diff := func(name, a, b string) {
		if a != b && b != "" {
			out = append(out, fmt.Sprintf("%s %s", name, b))
		}
	}
	diff("nproc", report.Nproc, m.Nproc)
	diff("CPU", report.CPUModel, m.CPUModel)
	diff("memory", report.MemTotal, m.MemTotal)
	diff("kernel", report.Kernel, m.Kernel)
	diff("Go", report.GoVersion, m.GoVersion)
	diff("MariaDB", report.MariaDB, m.MariaDB)
	diff("MariaDB settings", fmt.Sprint(report.MariaDBVars), fmt.Sprint(m.MariaDBVars))
	if m.Postgres != "" {
		diff("PostgreSQL", report.Postgres, m.Postgres)
		diff("PostgreSQL settings", fmt.Sprint(report.PostgresVars), fmt.Sprint(m.PostgresVars))
	}
	if len(out) == 0 {
		return ""
	}
	return "as above but " + strings.Join(out, ", ")
}

// optionsDiff lists the measurement settings in which o differs from the
// report's.
func optionsDiff(report, o map[string]any) string {
	var out []string
	for _, k := range []string{"quick", "duration", "warmup", "slices", "concurrency", "modes", "replay_pool", "b3_repetitions", "b4_levels"} {
		a, b := fmt.Sprint(report[k]), fmt.Sprint(o[k])
		if a != b {
			out = append(out, k+"="+b)
		}
	}
	return strings.Join(out, ", ")
}
