package main

// The webhook family (issue 35): payment callbacks delivered to the example
// service's webhook front-end (orderservice.PaymentWebhook: payment.Webhook
// with the Standard Webhooks verifier), on MariaDB and PostgreSQL, in events
// per second from the first delivery until the last answer, by a fixed
// number of senders. Every run creates its own orders, then delivers one
// payment.succeeded event per order, signed afresh for every delivery with
// idemstandard.Sign, as a provider does:
//
//	W0 naive            the usual handler (webhook_naive.go): the same
//	                    verifier, then look up the processed events, apply,
//	                    insert the event id, without the idempotency record
//	W0 state machine    the protected webhook's work without its record:
//	                    the verifier, then Orders.ApplyPayment (which
//	                    records each event id itself) in a plain
//	                    transaction
//	W1 <mode>           protected: the event applied in the idempotency
//	                    record's transaction, in each mode
//	W2 storm naive      every event delivered three times: two copies at
//	                    once, the third after both were answered
//	W2 storm <mode>     the same storm, protected
//
// After every run the effects are counted at the database: a protected run
// with an event applied twice, an order left unpaid, or a delivery answered
// other than 2xx (or 503 to a copy racing its twin, which the provider
// retries) fails the run; the naive handler's double effects are reported.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
)

const famWebhook = "webhook"

// webhookAttempts is how many times a sender delivers an event answered
// 503 before it counts as an error.
const webhookAttempts = 100

// webhookVariant is one way of handling the callbacks.
type webhookVariant struct {
	bench, name string
	protected   bool
	machine     bool // the state machine without the record
	mode        idempotency.Mode
	copies      int // deliveries of each event: 1, or 3 in a storm
}

// webhookBed is one database's webhook servers.
type webhookBed struct {
	r      *runner
	f      *family
	secret string
	urls   map[string]string // by handler: "naive" or a mode's name
	client *http.Client
	orders idempotency.Orders
	n      int // events a run
	conc   int // senders
	// deadlocks counts the protected webhooks' events not applied because
	// the database chose their transaction as a deadlock's victim.
	deadlocks deadlockCounter
}

// runWebhook measures the webhook variants over f.
func (r *runner) runWebhook(ctx context.Context, f *family) error {
	wb := &webhookBed{r: r, f: f, urls: map[string]string{}, client: newClient(2 * r.opts.webhookSend),
		n: r.opts.webhookEvents, conc: r.opts.webhookSend}
	fmt.Fprintf(os.Stderr, "== %s on %s: %d events a run, %d senders\n", famWebhook, f.name, wb.n, wb.conc)
	if err := wb.serve(ctx); err != nil {
		return err
	}
	// Single-phase first: the example records payment events single-phase
	// (orderservice.Options.PaymentEventsMode), so a quick run measures
	// that mode.
	modes := slices.Clone(r.opts.modes)
	slices.SortStableFunc(modes, func(a, b idempotency.Mode) int {
		first := func(m idempotency.Mode) int {
			if m == idempotency.ModeSinglePhase {
				return 0
			}
			return 1
		}
		return cmp.Compare(first(a), first(b))
	})
	nslices := r.opts.slices
	if r.opts.quick {
		modes, nslices = modes[:1], 1
	}
	runOf := func(v webhookVariant) fixedRun {
		return fixedRun{label: v.bench + " " + f.name + " " + v.name, run: func() (*Point, error) { return wb.run(ctx, v, wb.n) }}
	}
	naive := webhookVariant{bench: "W0", name: "naive", copies: 1}
	for _, v := range []webhookVariant{naive, {bench: "W1", protected: true, mode: modes[0], copies: 1}} {
		// Warm-up: connections, prepared statements.
		if _, err := wb.run(ctx, v, min(wb.n, 4*wb.conc)); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	once := []fixedRun{runOf(webhookVariant{bench: "W0", name: "state machine", machine: true, copies: 1})}
	var storms []fixedRun
	for _, m := range modes {
		once = append(once, runOf(webhookVariant{bench: "W1", name: modeName(m), protected: true, mode: m, copies: 1}))
		storms = append(storms, runOf(webhookVariant{bench: "W2", name: "storm " + modeName(m), protected: true, mode: m, copies: 3}))
	}
	for _, set := range []struct {
		base fixedRun
		runs []fixedRun
	}{
		{runOf(naive), once},
		{runOf(webhookVariant{bench: "W2", name: "storm naive", copies: 3}), storms},
	} {
		pts, err := rounds(nslices, set.base, set.runs)
		if err != nil {
			return err
		}
		for _, p := range pts {
			r.record(p)
			if d := p.Statuses["doubles"]; d > 0 && !strings.HasSuffix(p.Variant, " naive") {
				r.fail("%s %s: %d events applied twice", famWebhook, p.label(), d)
			}
		}
	}
	return nil
}

// serve starts the naive handler and a protected webhook per mode.
func (wb *webhookBed) serve(ctx context.Context) error {
	var b [24]byte
	_, _ = rand.Read(b[:])
	wb.secret = "whsec_" + base64.StdEncoding.EncodeToString(b[:])
	v, err := idemstandard.New(idemstandard.Config{Secrets: []string{wb.secret}})
	if err != nil {
		return err
	}
	plain, err := orderservice.New(wb.f.db, orderservice.Options{Dialect: wb.f.dialect})
	if err != nil {
		return err
	}
	wb.orders = plain.PaymentOrders()
	naive, err := newNaiveWebhook(ctx, wb.f.db, wb.f.dialect, v)
	if err != nil {
		return err
	}
	if wb.urls["naive"], err = wb.f.serveHTTP(naive); err != nil {
		return err
	}
	machine := &machineWebhook{db: wb.f.db, orders: wb.orders, v: v}
	if _, ok := wb.f.store.(idempotency.TxOptionsBeginner); ok && wb.f.dialect == "mysql" {
		machine.tx = &sql.TxOptions{Isolation: sql.LevelReadCommitted} // as orderservice's payment events
	}
	if wb.urls["machine"], err = wb.f.serveHTTP(machine); err != nil {
		return err
	}
	for _, m := range wb.r.opts.modes {
		svc, err := orderservice.New(wb.f.db, orderservice.Options{Dialect: wb.f.dialect, Idempotency: true, Store: wb.f.store,
			Config: idempotency.Config{Mode: m, Logger: slog.New(&wb.deadlocks)}, PaymentEventsMode: &m})
		if err != nil {
			return err
		}
		h, err := svc.PaymentWebhook(v, nil)
		if err != nil {
			return err
		}
		if wb.urls[modeName(m)], err = wb.f.serveHTTP(h); err != nil {
			return err
		}
	}
	return nil
}

// webhookEvent is one event a run delivers.
type webhookEvent struct {
	id   string
	body []byte
}

// run creates the run's orders, delivers their events with the variant's
// copies, and counts what they did.
func (wb *webhookBed) run(ctx context.Context, v webhookVariant, n int) (*Point, error) {
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	run := hex.EncodeToString(tag[:])
	events, err := wb.createOrders(ctx, run, n)
	if err != nil {
		return nil, err
	}
	url := wb.urls["naive"]
	switch {
	case v.protected:
		url = wb.urls[modeName(v.mode)]
	case v.machine:
		url = wb.urls["machine"]
	}
	var (
		next     atomic.Int64
		mu       sync.Mutex
		statuses = map[string]int{}
		errs     int
		firstErr string
	)
	// untilAcked delivers ev until an answer acknowledges it, as a
	// provider does: a 503 (the store failed for a moment, or the twin
	// copy holds the event) is delivered again after a pause; any other
	// answer is an error.
	untilAcked := func(ev webhookEvent) bool {
		for attempt := 1; ; attempt++ {
			status, err := wb.deliver(url, ev)
			mu.Lock()
			statuses[strconv.Itoa(status)]++
			statuses["deliveries"]++
			if err == nil && status != http.StatusServiceUnavailable && (status < 200 || status >= 300) {
				err = fmt.Errorf("status %d", status)
			}
			if err == nil && status == http.StatusServiceUnavailable && attempt == webhookAttempts {
				err = fmt.Errorf("still 503 after %d deliveries", attempt)
			}
			if err != nil {
				errs++
				if firstErr == "" {
					firstErr = err.Error()
				}
			}
			mu.Unlock()
			if err != nil || status != http.StatusServiceUnavailable {
				return err == nil
			}
			time.Sleep(time.Duration(min(attempt, 20)) * 5 * time.Millisecond)
		}
	}
	deadlocks := wb.deadlocks.n.Load()
	start := time.Now()
	var wg sync.WaitGroup
	for range wb.conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(events)) {
					return
				}
				ev, sent := events[i], 0
				if v.copies > 1 {
					// Two copies at once; the third once both were acknowledged.
					var twin sync.WaitGroup
					twin.Go(func() { untilAcked(ev) })
					untilAcked(ev)
					twin.Wait()
					sent = 2
				}
				for ; sent < v.copies; sent++ {
					untilAcked(ev)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	paid, doubles, err := wb.count(ctx, run, v.protected || v.machine)
	if err != nil {
		return nil, err
	}
	statuses["events"], statuses["doubles"], statuses["runs"] = len(events), doubles, 1
	statuses["deadlocks"] = int(wb.deadlocks.n.Load() - deadlocks)
	p := &Point{
		Family: famWebhook, Bench: v.bench, Variant: wb.f.name + " " + v.name, Concurrency: wb.conc,
		Requests: int64(len(events)), Errors: int64(errs), FirstError: firstErr, Seconds: elapsed.Seconds(),
		RPS: float64(len(events)) / elapsed.Seconds(), Statuses: statuses,
	}
	if paid != len(events) {
		p.Errors += int64(len(events) - paid)
		if p.FirstError == "" {
			p.FirstError = fmt.Sprintf("%d of %d orders paid", paid, len(events))
		}
	}
	fmt.Fprintf(os.Stderr, "    %-36s %5d events %6.2f s %6.0f events/s, answers %v\n", p.label(), len(events), elapsed.Seconds(), p.RPS, statuses)
	return p, nil
}

// deliver sends one delivery of ev, signed now, and returns the status.
func (wb *webhookBed) deliver(url string, ev webhookEvent) (int, error) {
	h, err := idemstandard.Sign(wb.secret, ev.id, time.Now(), ev.body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(ev.body))
	if err != nil {
		return 0, err
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := wb.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// webhookMarkdown writes the webhook family's section.
func (rep *Report) webhookMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famWebhook })
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	opts := rep.optionsOf(famWebhook)
	w("## Payment webhooks (%s)\n\n", famWebhook)
	w("Payment callbacks through the example service's webhook front-end (orderservice.PaymentWebhook: payment.Webhook with the Standard Webhooks verifier, POST /webhooks/standard) on loopback, %v senders at once. A run creates %v orders and delivers one `payment.succeeded` event for each, signed for every delivery with idemstandard.Sign as a provider signs; events/s is the run's events over the time from its first delivery until the last was acknowledged. A 503 answer (the store failed for a moment, or the event's twin copy holds it) is delivered again after a pause, as a provider retries: `503s` counts those answers, `deadlocks` those of them whose transaction the database chose as a deadlock's victim (counted from the protected webhook's log). ",
		opts["webhook_senders"], opts["webhook_events"])
	w("W0 naive is the usual handler, as examples/paysim -naive has it: the same verifier, then a look-up of the processed events, the effect (a log row and the order paid, one transaction), and the event id inserted, without the idempotency record. W0 state machine is the protected webhook's work without its idempotency record: the same verifier, then the order store's payment state machine (Orders.ApplyPayment, which records each event id in payment_event itself) in a plain transaction at the protected webhook's isolation level; /naive is what the payment facts cost, and W1 over it what the record costs (the `/state machine` column). W1 is protected, in each mode: the event applied to the order store's payment state machine in the idempotency record's transaction. W2 delivers every event three times, two copies at once and the third after both were acknowledged. Each variant runs between two runs of its naive twin; /naive is the variant over them. `double effects` counts events applied more than once over all of a variant's runs, read from the database after each run (the naive handler's effect log; the protected store's payments' events_applied): a protected run with any fails the benchmark.\n\n")
	// machine is each database's state machine over naive, the
	// denominator of the /state machine column.
	machine := map[string]float64{}
	for _, p := range pts {
		if db, variant, _ := strings.Cut(p.Variant, " "); variant == "state machine" && p.BaselineRPS > 0 {
			machine[db] = p.RPS / p.BaselineRPS
		}
	}
	w("| database | variant | events/s | /naive | /state machine | runs (events/s) | deliveries | 503s | deadlocks | double effects |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		db, variant, _ := strings.Cut(p.Variant, " ")
		ratio, overMachine := "—", ""
		if p.BaselineRPS > 0 {
			ratio = fmt.Sprintf("**%.2f**", p.RPS/p.BaselineRPS)
			if m := machine[db]; m > 0 && p.Bench == "W1" {
				overMachine = fmt.Sprintf("**%.2f**", p.RPS/p.BaselineRPS/m)
			}
		}
		w("| %s | %s %s | %.0f | %s | %s | %.0f–%.0f | %d | %d | %d | %d |\n", db, p.Bench, variant, p.RPS, ratio, overMachine,
			p.Server["run_rps_min"], p.Server["run_rps_max"], p.Statuses["deliveries"], p.Statuses["503"], p.Statuses["deadlocks"], p.Statuses["doubles"])
	}
	w("\nTarget (issue 35): protected ≥ 0.8 × naive, with 0 double effects where naive has some, in the mode the example service records payment events in: single-phase, with a 5 s InFlightWait (orderservice.Options.PaymentEventsMode). Claim-first is measured beside it for comparison; its lease protects nothing for events that write only in the database.\n\n")
	for _, p := range pts {
		if p.Bench == "W0" || p.BaselineRPS == 0 || strings.HasSuffix(p.Variant, "naive") {
			continue
		}
		verdict := "met"
		if p.RPS/p.BaselineRPS < 0.8 {
			verdict = "**not met**"
		}
		if strings.HasSuffix(p.Variant, "claim-first") {
			verdict += " (comparison)"
		}
		w("- %s %s: %.2f × naive, %d double effects: %s\n", p.Bench, p.Variant, p.RPS/p.BaselineRPS, p.Statuses["doubles"], verdict)
	}
	w("\n")
}
