package main

// B4's purge points: new keys on a table of existing records with and
// without a purge running beside them, alternating in slices, so that what
// a purge costs the writers is a ratio measured side by side.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
)

// PurgeTiming is what the purge did during one B4 purge comparison.
type PurgeTiming struct {
	Records int64  `json:"records"` // live records in the table
	Expired int64  `json:"expired"` // expired records loaded before the comparison
	Variant string `json:"variant"`
	Deleted int64  `json:"deleted"` // by the purge, during its slices
	// Seconds is how long the purge ran, over all its slices.
	Seconds float64 `json:"seconds"`
	Batches int     `json:"batches"`
	// BatchP99 is the 99th percentile of one batch's DELETE in ms: how long
	// the purge holds the locks of one batch.
	BatchP99 float64 `json:"batch_p99_ms"`
	// RanOut says the purge deleted every expired record before the
	// comparison's last slice ended: later slices ran without it.
	RanOut bool   `json:"ran_out"`
	Error  string `json:"error,omitempty"`
}

// purgeBatch is the batch the comparison purges with: idempotency.Purge's
// default.
const purgeBatch = 1000

// runB4Purge loads level/10 expired records beside level live ones, then
// measures new random keys (B4:P1, in each of modes) during a purge against
// the same without one (B4:P0), alternating in slices. The purge is
// idempotency.Purge's loop as a reconciler runs it: batches of purgeBatch,
// one after another, each a short statement of its own.
func (r *runner) runB4Purge(ctx context.Context, f *family, level int64, tag int, first map[idempotency.Mode]target, modes []idempotency.Mode, window time.Duration, slices int) error {
	expired := level / 10
	fmt.Fprintf(os.Stderr, "  loading %d expired records for the purge ...\n", expired)
	if _, err := bulkLoad(ctx, f.db, expired, tag, true); err != nil {
		return err
	}
	settle(ctx, f.db, r.opts.settleMax)
	for _, m := range modes {
		t := first[m]
		t.gen = genKeysOf(keysRandom)
		variant := modeName(m) + ", " + keysRandom.name
		pg := &purging{store: f.store}
		side := func(bench string, purge bool) sampler {
			return func(warmup, window time.Duration) *Point {
				if purge {
					pg.start(ctx)
					defer pg.stop()
				}
				return r.sample(f.client, f.probe, f.name, bench, variant, r.opts.b4Conc, level, t, warmup, window)
			}
		}
		p0, p := alternate(slices, window, r.opts.warmup, side("B4:P0", false), side("B4:P1", true))
		r.record(p0)
		r.record(p)
		p.Baseline, p.BaselineRPS, p.BaselineP99 = "B4:P0", p0.RPS, p0.P99
		pt := pg.timing(level, expired, variant)
		r.b4purges = append(r.b4purges, pt)
		fmt.Fprintf(os.Stderr, "  purge beside %s: %d deleted in %.1f s, %d batches, batch P99 %.1f ms, ran out %v %s\n",
			variant, pt.Deleted, pt.Seconds, pt.Batches, pt.BatchP99, pt.RanOut, pt.Error)
		if pt.Error != "" {
			r.fail("B4 purge beside %s: %s", variant, pt.Error)
		}
	}
	return nil
}

// purging runs Purge's batches in the background between start and stop,
// and keeps what they did.
type purging struct {
	store idempotency.Store

	done    chan struct{}
	quit    chan struct{}
	began   time.Time
	seconds float64
	deleted int64
	batches []time.Duration
	ranOut  bool
	err     error
	mu      sync.Mutex
}

func (pg *purging) start(ctx context.Context) {
	pg.quit, pg.done = make(chan struct{}), make(chan struct{})
	pg.began = time.Now()
	go func() {
		defer close(pg.done)
		for {
			select {
			case <-pg.quit:
				return
			default:
			}
			t0 := time.Now()
			n, err := pg.store.Purge(ctx, purgeBatch)
			pg.mu.Lock()
			pg.batches = append(pg.batches, time.Since(t0))
			pg.deleted += n
			if err != nil && pg.err == nil {
				pg.err = err
			}
			if n < purgeBatch {
				pg.ranOut = true
			}
			pg.mu.Unlock()
			if err != nil || n < purgeBatch {
				return
			}
		}
	}()
}

func (pg *purging) stop() {
	close(pg.quit)
	<-pg.done
	pg.seconds += time.Since(pg.began).Seconds()
}

func (pg *purging) timing(records, expired int64, variant string) PurgeTiming {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	pt := PurgeTiming{Records: records, Expired: expired, Variant: variant, Deleted: pg.deleted,
		Seconds: pg.seconds, Batches: len(pg.batches), RanOut: pg.ranOut}
	if pg.err != nil {
		pt.Error = pg.err.Error()
	}
	if len(pg.batches) > 0 {
		b := slices.Clone(pg.batches)
		slices.Sort(b)
		pt.BatchP99 = float64(b[(len(b)-1)*99/100].Microseconds()) / 1000
	}
	return pt
}

// purgeMarkdown writes what each B4 purge did, if any ran.
func (rep *Report) purgeMarkdown(b *strings.Builder) {
	if len(rep.B4Purges) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### New keys during a purge\n\n")
	w("At the largest level the run then adds a tenth as many expired records (created two days ago, expired an hour ago, keys spread like the live ones'), waits for their write-back as after a load, and measures new random keys during a purge (B4 P1) against the same without one (B4 P0), alternating in slices; the purge runs only in P1's slices. It is `Store.Purge` in batches of %d, one after another, as `idempotency.Purge` sends them: each batch one DELETE in its own transaction, taking the expired records in `(status, expires_at)` order. P1's \"vs baseline\" columns in the table below are the ratios to P0.\n\n", purgeBatch)
	w("| records | expired | new keys | deleted | purge seconds | deleted/s | batches | batch P99 ms | ran out |\n|---:|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, p := range rep.B4Purges {
		rate := 0.0
		if p.Seconds > 0 {
			rate = float64(p.Deleted) / p.Seconds
		}
		out := "no"
		if p.RanOut {
			out = "yes: later slices ran without a purge"
		}
		w("| %s | %s | %s | %d | %.1f | %.0f | %d | %.1f | %s |\n", humanCount(p.Records), humanCount(p.Expired), p.Variant, p.Deleted, p.Seconds, rate, p.Batches, p.BatchP99, out)
	}
	w("\n")
}
