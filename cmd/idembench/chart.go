package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

// errNothingToChart: the run measured no point the chart draws (a run of
// the queue or webhook family alone); no chart is written.
var errNothingToChart = errors.New("nothing to chart")

// chartRow is one scenario on the chart.
type chartRow struct {
	label string
	byC   map[int]*Point
}

// chart draws benchmarks.png: throughput per scenario and concurrency, the
// latency percentiles at the headline concurrency, and B4's levels.
func (rep *Report) chart(path string) error {
	var rows []*chartRow
	index := map[string]*chartRow{}
	add := func(label string, p *Point) {
		r := index[label]
		if r == nil {
			r = &chartRow{label: label, byC: map[int]*Point{}}
			index[label] = r
			rows = append(rows, r)
		}
		r.byC[p.Concurrency] = p
	}
	short := map[string]string{"mariadb": "MariaDB", "postgres": "Postgres", "sqlite": "SQLite", "fiber": ""}
	for _, fam := range []string{"mariadb", "postgres", "sqlite", "fiber"} {
		for _, g := range rep.B0 {
			if g.Family == fam {
				add(short[fam]+" B0", g)
			}
		}
		for _, p := range rep.Points {
			if p.Family == fam && (p.Bench == "B1" || p.Bench == "B2" || p.Bench == "B5") {
				label := short[fam] + " " + p.label()
				if p.Bench == "B5" {
					label = p.Variant
				}
				label = strings.NewReplacer("claim-first", "claim", "single-phase", "single", "first request", "first",
					" (adaptor, no idempotency)", " (no idem.)").Replace(strings.TrimSpace(label))
				add(label, p)
			}
		}
	}
	if len(rows) == 0 {
		return errNothingToChart
	}
	var concs []int
	for _, r := range rows {
		for c := range r.byC {
			if !slices.Contains(concs, c) {
				concs = append(concs, c)
			}
		}
	}
	slices.Sort(concs)
	labels := make([]string, len(rows))
	for i, r := range rows {
		labels[i] = r.label
	}

	// 1. Throughput bars, grouped by concurrency: creates and replays apart,
	// as replays run an order of magnitude faster.
	isReplay := func(label string) bool { return strings.Contains(label, "B2") }
	var thrPlots []*plot.Plot
	for _, replays := range []bool{false, true} {
		var sub []*chartRow
		for _, r := range rows {
			if isReplay(r.label) == replays {
				sub = append(sub, r)
			}
		}
		if len(sub) == 0 {
			continue
		}
		thr := plot.New()
		thr.Title.Text = "Throughput of creates: B0, B1, Fiber (closed loop, req/s; higher is better)"
		if replays {
			thr.Title.Text = "Throughput of replays: B2, Fiber (closed loop, req/s; higher is better)"
		}
		thr.Y.Label.Text = "req/s"
		thr.Y.Tick.Marker = intTicks{}
		subLabels := make([]string, len(sub))
		for i, r := range sub {
			subLabels[i] = r.label
		}
		thr.NominalX(subLabels...)
		rotate(thr)
		// Each group gets ~80% of the space one label has.
		width := vg.Length(0.8*13*72/float64(len(sub))) / vg.Length(len(concs))
		width = min(width, vg.Points(22))
		for i, c := range concs {
			vals := make(plotter.Values, len(sub))
			for j, r := range sub {
				if p := r.byC[c]; p != nil {
					vals[j] = p.RPS
				}
			}
			if err := addBars(thr, vals, width, i, len(concs), palette[i%len(palette)], fmt.Sprintf("concurrency %d", c)); err != nil {
				return err
			}
		}
		thr.Legend.Top = true
		thr.Legend.Left = true
		thr.Add(plotter.NewGrid())
		thrPlots = append(thrPlots, thr)
	}

	// 2. Latency percentiles at the headline concurrency (log scale).
	hc := headlineConc
	if !slices.Contains(concs, hc) {
		hc = concs[len(concs)-1]
	}
	lat := plot.New()
	lat.Title.Text = fmt.Sprintf("Latency at concurrency %d (ms, log scale; lower is better)", hc)
	lat.Y.Label.Text = "ms"
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lat.NominalX(labels...)
	rotate(lat)
	for i, pc := range []struct {
		name  string
		get   func(*Point) float64
		shape draw.GlyphDrawer
	}{
		{"P50", func(p *Point) float64 { return p.P50 }, draw.CircleGlyph{}},
		{"P99", func(p *Point) float64 { return p.P99 }, draw.TriangleGlyph{}},
		{"P99.9", func(p *Point) float64 { return p.P999 }, draw.SquareGlyph{}},
	} {
		var xys plotter.XYs
		for j, r := range rows {
			if p := r.byC[hc]; p != nil && pc.get(p) > 0 {
				xys = append(xys, plotter.XY{X: float64(j), Y: pc.get(p)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = palette[i]
		sc.GlyphStyle.Radius = vg.Points(4)
		sc.GlyphStyle.Shape = pc.shape
		lat.Add(sc)
		lat.Legend.Add(pc.name, sc)
	}
	lat.Legend.Top = true
	lat.Add(plotter.NewGrid())

	var plots [][]*plot.Plot
	for _, t := range thrPlots {
		plots = append(plots, []*plot.Plot{t})
	}
	plots = append(plots, []*plot.Plot{lat})

	// 3. B4: throughput and P99 against existing records.
	if b4 := rep.pointsOf(func(p *Point) bool { return strings.HasPrefix(p.Bench, "B4:") }); len(b4) > 0 {
		var levels []int64
		for _, p := range b4 {
			if !slices.Contains(levels, p.Records) {
				levels = append(levels, p.Records)
			}
		}
		slices.Sort(levels)
		lvLabels := make([]string, len(levels))
		for i, l := range levels {
			lvLabels[i] = humanCount(l) + " records"
		}
		left := plot.New()
		left.Title.Text = "B4: throughput vs existing records (req/s)"
		left.NominalX(lvLabels...)
		right := plot.New()
		right.Title.Text = "B4: P99 vs existing records (ms)"
		right.NominalX(lvLabels...)
		series := []string{"B4:B0"}
		for _, p := range b4 {
			if !slices.Contains(series, p.label()) {
				series = append(series, p.label())
			}
		}
		for i, label := range series {
			rps := make(plotter.Values, len(levels))
			p99 := make(plotter.Values, len(levels))
			n := make([]float64, len(levels))
			for _, p := range b4 {
				if p.label() == label {
					k := slices.Index(levels, p.Records)
					rps[k] += p.RPS
					p99[k] += p.P99
					n[k]++
				}
			}
			for k := range levels {
				if n[k] > 0 {
					rps[k] /= n[k]
					p99[k] /= n[k]
				}
			}
			name := strings.TrimPrefix(label, "B4:")
			if label == "B4:B0" {
				name = "B0 (no idempotency)"
			}
			for _, side := range []struct {
				pl   *plot.Plot
				vals plotter.Values
			}{{left, rps}, {right, p99}} {
				if err := addBars(side.pl, side.vals, vg.Points(20), i, len(series), palette[(i+2)%len(palette)], name); err != nil {
					return err
				}
			}
		}
		left.Legend.Top, right.Legend.Top = true, true
		left.Legend.Left, right.Legend.Left = true, true
		left.Y.Tick.Marker, right.Y.Tick.Marker = intTicks{}, intTicks{}
		left.Add(plotter.NewGrid())
		right.Add(plotter.NewGrid())
		plots = append(plots, []*plot.Plot{left, right})
	}

	// Lay the rows out; the B4 row has two plots side by side.
	const wIn, rowIn = 13, 4.6
	img := vgimg.New(wIn*vg.Inch, vg.Length(rowIn*float64(len(plots)))*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	for i, row := range plots {
		c := tiles.At(dc, 0, i)
		if len(row) == 1 {
			row[0].Draw(c)
			continue
		}
		sub := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Millimeter * 8}
		for j, p := range row {
			p.Draw(sub.At(c, j, 0))
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return err
	}
	return f.Close()
}

// addBars adds vals to pl as the i-th of n bar series side by side in
// each group, width wide, with a legend entry.
func addBars(pl *plot.Plot, vals plotter.Values, width vg.Length, i, n int, c color.Color, legend string) error {
	bars, err := plotter.NewBarChart(vals, width)
	if err != nil {
		return err
	}
	bars.Color = c
	bars.LineStyle.Width = 0
	bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * width
	pl.Add(bars)
	pl.Legend.Add(legend, bars)
	return nil
}

func rotate(p *plot.Plot) {
	p.X.Tick.Label.Rotation = math.Pi / 7
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
}

// intTicks are the default ticks labelled without decimals.
type intTicks struct{}

func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = fmt.Sprintf("%.0f", ticks[i].Value)
		}
	}
	return ticks
}
