package main

// The claim-floor family (issue 13, part 4): where claim-first's cost over
// the bare create goes, measured at the database without HTTP, so that the
// case for (or against) a faster claim-first rests on per-request database
// CPU and statements rather than on throughput alone.
//
// Each variant runs the example's create transaction (price lookup, INSERT
// as INIT, guarded UPDATE to CREATED) through the real MySQL store and the
// root package's order SQL, in closed loop, interleaved in slices with the
// bare create:
//
//	B0                    BEGIN, create, COMMIT
//	single-phase          BEGIN, create, InsertFinal (the DONE record), COMMIT
//	claim-first           Claim (autocommit), BEGIN, create, FinishTx, COMMIT
//	claim only            Claim (autocommit), BEGIN, create, COMMIT: no finish,
//	                      so no fence: not a protocol, the cost of the durable
//	                      claim alone
//	claim-first, batched  claim-first with concurrent claims sharing one
//	                      multi-row INSERT and one commit (the idea):
//	                      while one batch is in flight, the claims that
//	                      arrive queue for the next
//
// The database-CPU difference between "claim-first" and "claim only" is the
// finish, the second touch of the record inside the business transaction;
// between "claim only" and B0, the claim. Batching can only shrink the
// latter.

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency"
)

const famFloor = "claim-floor"

// floorOp is one request of a variant: it returns when its work committed.
type floorOp func(ctx context.Context, w *worker) error

// runFloor measures the claim-floor variants over f (MariaDB).
func (r *runner) runFloor(ctx context.Context, f *family) error {
	c := headlineConc
	fmt.Fprintf(os.Stderr, "== %s: claim-first's cost by statement, at the database (c=%d)\n", famFloor, c)
	store := idempotency.NewMySQLStore(f.db)
	fl := &floor{db: f.db, store: store, batch: &claimBatcher{db: f.db}}
	bare := fl.op(false, false, nil)
	variants := []struct {
		name string
		op   floorOp
	}{
		{"single-phase", fl.singlePhase},
		{"claim-first", fl.op(true, true, fl.claim)},
		{"claim only (no finish)", fl.op(true, false, fl.claim)},
		{"claim-first, batched claims", fl.op(true, true, fl.batch.claim)},
	}
	for _, v := range variants {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.measureAgainst(nil, f.probe, famFloor, c, 0, "B0", opTarget(bare), "B1", v.name, opTarget(v.op))
	}
	if b := fl.batch; b.batches.Load() > 0 {
		r.note("%s: batched claims averaged %.1f claims per INSERT at c=%d", famFloor,
			float64(b.rows.Load())/float64(b.batches.Load()), c)
	}
	return nil
}

// opTarget drives op in closed loop as runLoad drives requests: each
// committed op is a 201.
func opTarget(op floorOp) target {
	return target{gen: func(*worker) request { return request{} }, wantStatus: http.StatusCreated,
		call: func(w *worker, _ request) (int, bool, error) {
			if err := op(context.Background(), w); err != nil {
				return 0, false, err
			}
			return http.StatusCreated, false, nil
		}}
}

// floor holds what the variants share.
type floor struct {
	db    *sql.DB
	store *idempotency.SQLStore
	batch *claimBatcher
	seq   atomic.Int64
}

// create is the example's create transaction on tx.
func (fl *floor) create(ctx context.Context, tx *sql.Tx, w *worker, scope, key string) error {
	sku := int64(firstSKU + (w.id*7+w.n)%numSKUs)
	var price int64
	if err := tx.QueryRowContext(ctx, `SELECT price_cents FROM sku WHERE id = ?`, sku).Scan(&price); err != nil {
		return err
	}
	o := &idempotency.Order{
		OrderNo: fmt.Sprintf("FL%d-%d", os.Getpid(), fl.seq.Add(1)), Scope: scope, IdempotencyKey: key,
		UserID: int64(w.user()), SKUID: sku, Quantity: 1, UnitPriceCents: price, TotalCents: price,
	}
	return idempotency.CreateOrder(ctx, tx, o)
}

// op builds a variant: with claim, the record is claimed first; with
// finish, it is finished (fenced) inside the business transaction.
func (fl *floor) op(claimFirst, finish bool, claim func(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error)) floorOp {
	return func(ctx context.Context, w *worker) error {
		w.n++
		scope, key := fmt.Sprint(w.user()), w.newKey()
		var lease idempotency.Lease
		if claimFirst {
			var err error
			lease, err = claim(ctx, fl.claimFor(scope, key))
			if err != nil {
				return err
			}
		}
		tx, err := fl.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fl.create(ctx, tx, w, scope, key); err != nil {
			return err
		}
		if finish {
			snap := &idempotency.Snapshot{StatusCode: 201, Body: []byte(`{"order_no":"x"}`)}
			if _, err := fl.store.FinishTx(ctx, tx, lease, idempotency.StatusDone, snap, time.Hour); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
}

func (fl *floor) claimFor(scope, key string) idempotency.Claim {
	return idempotency.Claim{Scope: scope, Key: key, Fingerprint: strings.Repeat("f", 64),
		Owner: "floor-" + key, Lease: time.Minute, Retention: time.Hour}
}

func (fl *floor) claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	return fl.store.Claim(ctx, c)
}

func (fl *floor) singlePhase(ctx context.Context, w *worker) error {
	w.n++
	scope, key := fmt.Sprint(w.user()), w.newKey()
	tx, err := fl.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fl.create(ctx, tx, w, scope, key); err != nil {
		return err
	}
	snap := &idempotency.Snapshot{StatusCode: 201, Body: []byte(`{"order_no":"x"}`)}
	if err := fl.store.InsertFinal(ctx, tx, fl.claimFor(scope, key), idempotency.StatusDone, snap); err != nil {
		return err
	}
	return tx.Commit()
}

// claimBatcher inserts concurrent claims with one multi-row INSERT in
// autocommit: the first claim to arrive while no batch is in flight leads,
// and takes every claim that queued meanwhile. It is a measurement of the
// idea, not a store: every key here is new, so no row can collide.
type claimBatcher struct {
	db *sql.DB

	mu      sync.Mutex
	queue   []*queuedClaim
	leading bool

	batches, rows atomic.Int64
}

type queuedClaim struct {
	c    idempotency.Claim
	done chan error
}

func (b *claimBatcher) claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	q := &queuedClaim{c: c, done: make(chan error, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	if !b.leading {
		b.leading = true
		for len(b.queue) > 0 {
			batch := b.queue
			b.queue = nil
			b.mu.Unlock()
			err := b.insert(ctx, batch)
			for _, m := range batch {
				m.done <- err
			}
			b.mu.Lock()
		}
		b.leading = false
	}
	b.mu.Unlock()
	if err := <-q.done; err != nil {
		return idempotency.Lease{}, err
	}
	return idempotency.Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: 1}, nil
}

func (b *claimBatcher) insert(ctx context.Context, batch []*queuedClaim) error {
	var sb strings.Builder
	sb.WriteString(`INSERT INTO idempotency_record
  (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
   locked_until, created_at, updated_at, expires_at) VALUES `)
	args := make([]any, 0, 6*len(batch))
	for i, q := range batch {
		if i > 0 {
			sb.WriteString(",\n")
		}
		sb.WriteString(`(?, ?, ?, 'PROCESSING', ?, 1, NOW(6) + INTERVAL ? MICROSECOND, NOW(6), NOW(6), NOW(6) + INTERVAL ? MICROSECOND)`)
		args = append(args, q.c.Scope, q.c.Key, q.c.Fingerprint, q.c.Owner, q.c.Lease.Microseconds(), q.c.Retention.Microseconds())
	}
	b.batches.Add(1)
	b.rows.Add(int64(len(batch)))
	_, err := b.db.ExecContext(ctx, sb.String(), args...)
	return err
}

// floorMarkdown writes the claim-floor family's section, if it ran.
func (rep *Report) floorMarkdown(b *strings.Builder) {
	pts := rep.pointsOf(func(p *Point) bool { return p.Family == famFloor })
	if len(pts) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Claim-first's cost by statement (%s, MariaDB)\n\n", famFloor)
	b.WriteString("The create transaction and the record statements of the real MySQL store, driven in closed loop at the database without HTTP, each variant in slices alternating with the bare create (B0 first and last). CPU is per request: `db` is mariadbd, `go` this process (driver and load). \"claim only\" claims the record and never finishes it: not a protocol, the cost of the durable claim alone; \"batched claims\" shares one multi-row INSERT and one commit among the claims that arrive while the previous batch is in flight.\n\n")
	b.WriteString("| variant | c | req/s | /B0 | P99 ms | /B0 | db CPU ms/req | B0's | go CPU ms/req | B0's | round trips/req | fsync/req |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var b0 *Point
	for _, p := range pts {
		if p.Bench == "B0" {
			b0 = p
			continue
		}
		if b0 == nil || p.BaselineRPS == 0 {
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | **%.2f** | %.2f | %.2f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |\n",
			p.Variant, p.Concurrency, p.RPS, p.RPS/p.BaselineRPS, p.P99, p.P99/p.BaselineP99,
			p.Server["cpu_db_ms_per_req"], b0.Server["cpu_db_ms_per_req"],
			p.Server["cpu_self_ms_per_req"], b0.Server["cpu_self_ms_per_req"],
			p.Server["round_trips"], p.Server["fsyncs"])
	}
}
