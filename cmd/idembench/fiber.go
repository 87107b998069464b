package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"
	fiberidem "github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// fiberDifferences states what Fiber's middleware does not do that ours does;
// the report prints it beside the numbers.
var fiberDifferences = []string{
	"no request fingerprint: the same key with a different body replays the first answer instead of 409/422",
	"the lock is per process (an in-memory mutex per key): two instances can execute the same key at once",
	"every answer the handler returns is stored and replayed, 5xx included, so a transient failure is replayed until the key expires (ours stores < 500 only and releases the key otherwise)",
	"the answer is stored in Redis after the business transaction committed, not in it: a crash or Redis error between the two lets a retry execute again (ours commits the record and the order together)",
	"keys are not scoped by principal: any caller who knows a key gets its stored answer",
	"a concurrent duplicate waits on the lock for the original (ours answers 409 in-progress at once, or waits up to InFlightWait)",
	"keys must be exactly 36 characters by default (a UUID); this benchmark sends UUIDs to both",
}

// serveFiber serves a Fiber app whose POST /orders runs orderservice's
// create handler unprotected (the B0 transaction), adapted with Fiber's
// net/http adaptor, behind Fiber's idempotency middleware when storage is
// set. It returns the URL of POST /orders.
func (f *family) serveFiber(storage fiber.Storage) (string, error) {
	svc, err := f.newService(orderservice.Options{})
	if err != nil {
		return "", err
	}
	app := fiber.New(fiber.Config{ReadTimeout: 30 * time.Second})
	handler := adaptor.HTTPHandler(svc)
	if storage != nil {
		app.Post("/orders", fiberidem.New(fiberidem.Config{
			Storage:   storage,
			KeyHeader: "Idempotency-Key",
			Lifetime:  10 * time.Minute, // the benchmark's keys expire from Redis by themselves
		}), handler)
	} else {
		app.Post("/orders", handler)
	}
	app.Get("/healthz", func(c fiber.Ctx) error { return c.SendString("ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	f.cleanup = append(f.cleanup, func() { _ = app.ShutdownWithTimeout(5 * time.Second) })
	return "http://" + ln.Addr().String() + "/orders", nil
}

// openRedis connects Fiber's Redis storage, or says why it cannot.
func openRedis(addr string) (st *redis.Storage, err error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	conn.Close()
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil { // redis.New panics when PING fails
			st, err = nil, fmt.Errorf("redis: %v", p)
		}
	}()
	return redis.New(redis.Config{Host: host, Port: port}), nil
}

// runFiber is B5: the same create workload through Fiber v3's idempotency
// middleware with Redis storage, interleaved with ours on the same database.
func (r *runner) runFiber(ctx context.Context, f *family) error {
	fmt.Fprintf(os.Stderr, "== B5: Fiber v3 middleware/idempotency + Redis vs ours\n")
	storage, err := openRedis(r.opts.redis)
	if err != nil {
		r.note("B5 skipped: Redis at %s unreachable: %v", r.opts.redis, err)
		return nil
	}
	f.cleanup = append(f.cleanup, func() { _ = storage.Close() })
	probe := mariaAndRedisProbe(f.probe)

	fbaseURL, err := f.serveFiber(nil)
	if err != nil {
		return err
	}
	fidemURL, err := f.serveFiber(storage)
	if err != nil {
		return err
	}
	fBase := target{url: fbaseURL, gen: genBaseline, wantStatus: http.StatusCreated}
	fFirst := target{url: fidemURL, keyHeader: "Idempotency-Key", gen: genNewKey, wantStatus: http.StatusCreated}
	ours, err := f.firstTarget(idempotency.Config{})
	if err != nil {
		return err
	}
	fpool, err := createPool(f.client, fFirst, r.opts.poolSize, 16)
	if err != nil {
		return err
	}
	fReplay := target{url: fidemURL, keyHeader: "Idempotency-Key", gen: genReplay(fpool), wantStatus: http.StatusCreated}
	opool, err := createPool(f.client, ours, r.opts.poolSize, 16)
	if err != nil {
		return err
	}
	oReplay, err := f.replayTarget(idempotency.Config{}, opool)
	if err != nil {
		return err
	}
	for _, c := range r.opts.concurrency {
		m := func(bench, variant string, t target) *Point {
			return r.measure(f.client, probe, "fiber", bench, variant, c, 0, t)
		}
		var seq []*Point
		if !r.opts.quick {
			seq = append(seq, m("B5", "Fiber B0 (adaptor, no idempotency)", fBase))
		}
		seq = append(seq, m("B5", "Fiber B1 first request", fFirst))
		seq = append(seq, m("B5", "ours B1 claim-first", ours))
		if !r.opts.quick {
			seq = append(seq, m("B5", "Fiber B1 first request", fFirst))
		}
		seq = append(seq, m("B5", "Fiber B2 replay", fReplay))
		seq = append(seq, m("B5", "ours B2 cache on", oReplay))
		if !r.opts.quick {
			seq = append(seq, m("B5", "Fiber B2 replay", fReplay))
		}
		setBaselines(seq, func(p *Point) string {
			switch p.Variant {
			case "ours B1 claim-first":
				return "B5 Fiber B1 first request"
			case "ours B2 cache on":
				return "B5 Fiber B2 replay"
			}
			return ""
		})
	}
	return nil
}

// fiberMarkdown writes the B5 section, if B5 ran.
func (rep *Report) fiberMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if pts := rep.pointsOf(func(p *Point) bool { return p.Bench == "B5" }); len(pts) > 0 {
		w("## B5: Fiber v3 `middleware/idempotency` + Redis (peer)\n\n")
		w("A Fiber v3.1.0 app (fasthttp) whose POST /orders is orderservice's unprotected create handler through `middleware/adaptor`, behind `middleware/idempotency` with `gofiber/storage/redis/v3` v3.4.3 (KeyHeader Idempotency-Key). Ours is the net/http server with the middleware (claim-first, defaults) on the same database, measured between Fiber runs. Ratios are ours/Fiber.\n\n")
		rep.table(b, "fiber", pts, false)
		w("What Fiber's middleware does not do, which the numbers do not show:\n\n")
		for _, d := range rep.Fiber {
			w("- %s\n", d)
		}
		w("\n")
	}
}
