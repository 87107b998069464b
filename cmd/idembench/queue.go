package main

// The queue family (issue 24): the example order service's create consumed
// from a queue, on NATS JetStream and RabbitMQ over MariaDB, in messages
// per second from the consumer's start until every message is settled.
// Each run pre-publishes its messages to a subject or queue of its own, so
// that publishing is never measured, then starts examples/orderconsumer's
// consumer (orderqueue.Run) with a fixed number of workers:
//
//	Q0                the baseline: unprotected, one message per plain
//	                  transaction, acked after its commit
//	Q0 batched        unprotected, a batch of messages per transaction
//	Q1 <mode>         protected (the service's create_order Middleware),
//	                  one by one
//	Q1 <mode> batched protected, a batch per transaction (DoBatch)
//	Q2 storm          every message delivered three times (published
//	                  three times under one key, in three rounds): one
//	                  order and two replays each; unprotected, three orders
//
// The variants of a broker run one after another, each between two runs of
// Q0, and again for every slice: a variant's baseline is the Q0 runs around
// it, so a slow spell of the machine falls on both.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/queue"
)

const famQueue = "queue"

// queueVariant is one way of consuming.
type queueVariant struct {
	bench, name string
	protected   bool
	mode        idempotency.Mode
	batch       int
	copies      int // deliveries of each message
}

func (v queueVariant) label(broker string) string {
	return strings.TrimSpace(v.bench + " " + broker + " " + v.name)
}

// runQueue measures the queue variants on every reachable broker over f
// (MariaDB).
func (r *runner) runQueue(ctx context.Context, f *family) error {
	n, workers, batch := r.opts.queueMessages, r.opts.queueWorkers, r.opts.queueBatch
	fmt.Fprintf(os.Stderr, "== %s: %d messages a run, %d workers, batches of %d\n", famQueue, n, workers, batch)
	base := queueVariant{bench: "Q0", batch: 1, copies: 1}
	variants := []queueVariant{
		{bench: "Q1", name: "claim-first", protected: true, mode: idempotency.ModeClaimFirst, batch: 1, copies: 1},
		{bench: "Q1", name: "single-phase", protected: true, mode: idempotency.ModeSinglePhase, batch: 1, copies: 1},
		{bench: "Q0", name: "batched", batch: batch, copies: 1},
		{bench: "Q1", name: "claim-first batched", protected: true, mode: idempotency.ModeClaimFirst, batch: batch, copies: 1},
		{bench: "Q1", name: "single-phase batched", protected: true, mode: idempotency.ModeSinglePhase, batch: batch, copies: 1},
		{bench: "Q2", name: "storm claim-first", protected: true, mode: idempotency.ModeClaimFirst, batch: 1, copies: 3},
		{bench: "Q2", name: "storm unprotected", batch: 1, copies: 3},
	}
	ran := false
	for _, b := range []struct{ kind, url string }{{"nats", r.opts.natsURL}, {"amqp", r.opts.amqpURL}} {
		if b.url == "" {
			continue
		}
		if err := reachable(b.url); err != nil {
			r.note("%s: %s skipped: %v", famQueue, b.kind, err)
			continue
		}
		ran = true
		qr := &queueRunner{r: r, f: f, broker: b.url, kind: b.kind, workers: workers, n: n}
		if _, err := qr.run(ctx, base); err != nil { // warm-up: connections, pools, caches
			return fmt.Errorf("%s warm-up: %w", b.kind, err)
		}
		slices := r.opts.slices
		if r.opts.quick {
			slices = 1 // a report of the quick run, about 15 s
		}
		runOf := func(v queueVariant) fixedRun {
			return fixedRun{label: v.label(b.kind), run: func() (*Point, error) {
				p, err := qr.run(ctx, v)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", b.kind, v.label(b.kind), err)
				}
				return p, nil
			}}
		}
		var runs []fixedRun
		for _, v := range variants {
			runs = append(runs, runOf(v))
		}
		pts, err := rounds(slices, runOf(base), runs)
		if err != nil {
			return err
		}
		for _, p := range pts {
			r.record(p)
		}
	}
	if !ran {
		return errors.New("no broker reachable (-nats, -amqp)")
	}
	return nil
}

// queueRunner runs one broker's variants.
type queueRunner struct {
	r       *runner
	f       *family
	broker  string
	kind    string
	workers int
	n       int
	svcs    map[string]*orderservice.Service
}

// service is the order service of a variant over the family's database.
func (q *queueRunner) service(v queueVariant) (*orderservice.Service, error) {
	key := "unprotected"
	if v.protected {
		key = modeName(v.mode)
	}
	if s := q.svcs[key]; s != nil {
		return s, nil
	}
	opts := orderservice.Options{}
	if v.protected {
		opts.Idempotency, opts.Config = true, idempotency.Config{Mode: v.mode}
	}
	s, err := q.f.newService(opts)
	if err != nil {
		return nil, err
	}
	if q.svcs == nil {
		q.svcs = map[string]*orderservice.Service{}
	}
	q.svcs[key] = s
	return s, nil
}

// run publishes the variant's messages to a topology of the run's own,
// consumes them until every one is settled, and checks the orders made.
func (q *queueRunner) run(ctx context.Context, v queueVariant) (*Point, error) {
	svc, err := q.service(v)
	if err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "idembench_" + hex.EncodeToString(b[:])
	topo := orderqueue.NamedTopology(strings.ToUpper(name), name+".create", "idembench", name)
	if err := orderqueue.EnsureTopology(ctx, q.broker, topo); err != nil {
		return nil, err
	}
	defer q.deleteTopology(topo)
	total := q.n * v.copies
	if err := q.publish(ctx, topo, v.copies); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	before, err := q.orders(ctx)
	if err != nil {
		return nil, err
	}

	var final, naks atomic.Int64
	done := make(chan struct{})
	opts := orderqueue.Options{
		Broker: q.broker, Topology: topo, Workers: q.workers, BatchSize: v.batch,
		RetryDelay: 50 * time.Millisecond, Backoff: queue.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		Observe: func(s queue.Settlement) {
			if s.Decision == queue.Nak {
				naks.Add(1)
				return
			}
			if final.Add(1) == int64(total) {
				close(done)
			}
		},
	}
	if !v.protected {
		opts.Unprotected = q.f.db
	}
	cctx, cancel := context.WithCancel(ctx)
	ended := make(chan error, 1)
	start := time.Now()
	go func() { ended <- orderqueue.Run(cctx, svc, opts) }()
	var elapsed time.Duration
	select {
	case <-done:
		elapsed = time.Since(start)
	case err := <-ended:
		cancel()
		return nil, fmt.Errorf("the consumer stopped: %w", err)
	case <-time.After(5 * time.Minute):
		cancel()
		<-ended
		return nil, fmt.Errorf("%d of %d messages settled within 5 minutes", final.Load(), total)
	}
	cancel()
	if err := <-ended; err != nil {
		return nil, err
	}
	after, err := q.orders(ctx)
	if err != nil {
		return nil, err
	}
	made := after - before
	want := q.n
	if !v.protected {
		want = total // the unprotected consumer runs every delivery
	}
	p := &Point{
		Family: famQueue, Bench: v.bench, Variant: strings.TrimSpace(q.kind + " " + v.name), Concurrency: q.workers,
		Requests: int64(total), Seconds: elapsed.Seconds(), RPS: float64(total) / elapsed.Seconds(),
		Statuses: map[string]int{"orders": made, "naks": int(naks.Load()), "runs": 1},
	}
	if made != want {
		p.Errors = int64(total)
		p.FirstError = fmt.Sprintf("%d orders for %d messages (want %d)", made, total, want)
	}
	fmt.Fprintf(os.Stderr, "    %-40s %6d msgs %6.2f s %8.0f msg/s orders %d naks %d\n", v.label(q.kind), total, elapsed.Seconds(), p.RPS, made, naks.Load())
	return p, nil
}

// publish publishes n creates (copies times each, in rounds), from 8
// publishers at once; user i%16+1, a new key each, SKUs in turn.
func (q *queueRunner) publish(ctx context.Context, topo orderqueue.Topology, copies int) error {
	msgs := make([]orderqueue.Message, q.n)
	for i := range msgs {
		user := i%users + 1
		msgs[i] = orderqueue.Message{User: fmt.Sprint(user), Key: client.NewKey(),
			Body: fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":1}`, user, orderservice.FirstSKU+int64(i%100))}
	}
	const publishers = 8
	for range copies {
		var wg sync.WaitGroup
		errs := make(chan error, publishers)
		for w := range publishers {
			wg.Go(func() {
				pub, err := orderqueue.Dial(q.broker, topo)
				if err != nil {
					errs <- err
					return
				}
				defer pub.Close()
				for i := w; i < len(msgs); i += publishers {
					if _, err := pub.Publish(ctx, msgs[i]); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

func (q *queueRunner) orders(ctx context.Context) (int, error) {
	var n int
	err := q.f.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM purchase_order`).Scan(&n)
	return n, err
}

func (q *queueRunner) deleteTopology(topo orderqueue.Topology) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if q.kind == "nats" {
		nc, err := orderqueue.ConnectNATS(q.broker)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		_ = js.DeleteStream(ctx, topo.Stream)
		_ = js.DeleteStream(ctx, topo.DeadLetterStream)
		return
	}
	conn, err := amqp.Dial(q.broker)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(topo.Queue, false, false, false)
		_, _ = ch.QueueDelete(topo.DeadLetterQueue, false, false, false)
	}
}

// reachable dials a broker URL's host.
func reachable(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// queueMarkdown writes the queue family's section.
func (rep *Report) queueMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famQueue })
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	opts := rep.optionsOf(famQueue)
	w("\n## Queue consumers (%s, MariaDB)\n\n", famQueue)
	w("The create consumed from a queue by examples/orderconsumer's consumer (%v workers; batched variants take up to %v messages per transaction), on a fresh subject or queue per run, its %v messages (three times as many deliveries in Q2) published before the consumer starts: msg/s is deliveries settled from the consumer's start until the last. ",
		opts["queue_workers"], opts["queue_batch"], opts["queue_messages"])
	w("Q0 is the unprotected consumer (a plain transaction per message, acked after its commit), each variant measured between two of its runs; /Q0 is the variant over them. Q1 is protected by the service's create_order Middleware, one by one (Do) or in batches (DoBatch); Q2 delivers every message three times (three publishes under one key): protected, one order and two replays each; unprotected, three orders. `orders` counts purchase_order rows the runs made, over all slices; `runs` is the slowest and the fastest run's msg/s, which shows how much the machine's other work moved them.\n\n")
	w("| broker | variant | msg/s | /Q0 | runs (msg/s) | orders | naks |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		broker, variant, _ := strings.Cut(p.Variant, " ")
		ratio := "—"
		if p.BaselineRPS > 0 {
			ratio = fmt.Sprintf("**%.2f**", p.RPS/p.BaselineRPS)
		}
		w("| %s | %s %s | %.0f | %s | %.0f–%.0f | %d | %d |\n", broker, p.Bench, variant, p.RPS, ratio,
			p.Server["run_rps_min"], p.Server["run_rps_max"], p.Statuses["orders"], p.Statuses["naks"])
	}
	w("\nTargets (issue 24): protected batched ≥ 0.9 × Q0, protected one by one ≥ 0.75 × Q0.\n\n")
	for _, p := range pts {
		if p.Bench != "Q1" || p.BaselineRPS == 0 {
			continue
		}
		target := 0.75
		if strings.HasSuffix(p.Variant, "batched") {
			target = 0.9
		}
		verdict := "met"
		if p.RPS/p.BaselineRPS < target {
			verdict = "**not met**"
		}
		w("- %s: %.2f × Q0, target %.2f: %s\n", p.Variant, p.RPS/p.BaselineRPS, target, verdict)
	}
	w("\n")
}
