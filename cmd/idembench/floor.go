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
//	claim-first, minimal  claim-first's two touches on the smallest record a
//	                      fenced claim can have (floorMinimalTable: the key,
//	                      a status and the owner, no snapshot, no secondary
//	                      index): the floor of the mode's shape, a durable
//	                      claim and a fenced finish, whatever the layout
//
// The database-CPU difference between "claim-first" and "claim only" is the
// finish, the second touch of the record inside the business transaction;
// between "claim only" and B0, the claim. Batching can only shrink the
// latter.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
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
	minimal := minimalStore{store, f.db, false}
	bare := fl.op(nil, nil)
	variants := []struct {
		name string
		op   floorOp
	}{
		{"single-phase", fl.singlePhase},
		{"claim-first", fl.op(store.Claim, store.FinishTx)},
		{"claim only (no finish)", fl.op(store.Claim, nil)},
		{"claim-first, batched claims", fl.op(fl.batch.claim, store.FinishTx)},
		{"claim-first, minimal record", fl.op(minimal.Claim, minimal.FinishTx)},
	}
	if err := fl.createMinimal(ctx); err != nil {
		return err
	}
	for _, v := range variants {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.measureAgainst(nil, f.probe, famFloor, c, 0, "B0", opTarget(bare), "B1", v.name, opTarget(v.op))
	}
	// Over HTTP, where issue 37's targets are set: the example service's
	// claim-first with the real record, with the minimal one (a store
	// whose claim and finish touch floorMinimalTable), and with the minimal
	// one that also keeps the fingerprint and the answer, each against the
	// bare create served the same way.
	if ctx.Err() == nil {
		base, err := f.baselineTarget()
		if err != nil {
			return err
		}
		cfg := idempotency.Config{Mode: idempotency.ModeClaimFirst}
		full, err := f.firstTarget(cfg)
		if err != nil {
			return err
		}
		on := func(st minimalStore) (target, error) {
			svc, err := orderservice.New(f.db, orderservice.Options{Idempotency: true, Config: cfg, Store: st, Dialect: f.dialect})
			if err != nil {
				return target{}, err
			}
			url, err := f.serveHTTP(svc)
			return target{url: url, gen: genNewKey, wantStatus: http.StatusCreated, keyHeader: "Idempotency-Key"}, err
		}
		onMinimal, err := on(minimal)
		if err != nil {
			return err
		}
		onReplayable, err := on(minimalStore{store, f.db, true})
		if err != nil {
			return err
		}
		for _, v := range []struct {
			name string
			t    target
		}{{"claim-first", full}, {"claim-first, minimal record", onMinimal},
			{"claim-first, minimal record with the fingerprint and the answer", onReplayable}} {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.measureAgainst(f.client, f.probe, famFloor, c, 0, "H0", base, "H1", v.name, v.t)
		}
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
func (fl *floor) op(claim func(context.Context, idempotency.Claim) (idempotency.Lease, error),
	finish func(context.Context, *sql.Tx, idempotency.Lease, idempotency.Status, *idempotency.Snapshot, time.Duration) (idempotency.Lease, error)) floorOp {
	return func(ctx context.Context, w *worker) error {
		w.n++
		scope, key := fmt.Sprint(w.user()), w.newKey()
		var lease idempotency.Lease
		if claim != nil {
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
		if finish != nil {
			snap := &idempotency.Snapshot{StatusCode: 201, Body: []byte(`{"order_no":"x"}`)}
			if _, err := finish(ctx, tx, lease, idempotency.StatusDone, snap, time.Hour); err != nil {
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

// floorMinimalTable is the smallest record a fenced claim can have: the
// key, a status the finish moves, and the owner that fences it; and, for
// the replayable variant, what a 409 and a replay need besides: the
// fingerprint and the answer.
const floorMinimalTable = "idembench_minimal_record"

func (fl *floor) createMinimal(ctx context.Context) error {
	if _, err := fl.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+floorMinimalTable); err != nil {
		return err
	}
	_, err := fl.db.ExecContext(ctx, `CREATE TABLE `+floorMinimalTable+` (
  scope           VARBINARY(255) NOT NULL,
  idempotency_key VARBINARY(255) NOT NULL,
  status          TINYINT        NOT NULL,
  locked_by       VARBINARY(128) NOT NULL,
  -- written only by the replayable variant (minimalStore.replayable)
  request_fingerprint VARBINARY(128) NULL,
  response_status     SMALLINT       NULL,
  response_headers    BLOB           NULL,
  response_body       MEDIUMBLOB     NULL,
  PRIMARY KEY (scope, idempotency_key)
) ENGINE=InnoDB`)
	return err
}

// minimalStore is the real store but for a new key's two touches, which
// go to floorMinimalTable: the claim commits on its own, the finish is
// fenced by owner and status inside the create's transaction, as the
// store's are. Claim-first on it pays for the smallest record a fenced
// claim can have. Only new keys are sent to it (nothing it writes is ever
// looked up). With replayable it also writes the fingerprint and the
// answer: the record less its timestamps, lease version and index.
type minimalStore struct {
	*idempotency.SQLStore
	db         *sql.DB
	replayable bool
}

func (s minimalStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.Lease, error) {
	var fingerprint any
	if s.replayable {
		fingerprint = c.Fingerprint
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO `+floorMinimalTable+
		` (scope, idempotency_key, status, locked_by, request_fingerprint) VALUES (?, ?, 0, ?, ?)`,
		c.Scope, c.Key, c.Owner, fingerprint); err != nil {
		return idempotency.Lease{}, err
	}
	return idempotency.Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: 1}, nil
}

func (s minimalStore) FinishTx(ctx context.Context, tx *sql.Tx, l idempotency.Lease, _ idempotency.Status, snap *idempotency.Snapshot, _ time.Duration) (idempotency.Lease, error) {
	var status, headers, body any
	if s.replayable {
		h, err := json.Marshal(snap.Header)
		if err != nil {
			return idempotency.Lease{}, err
		}
		status, headers, body = snap.StatusCode, h, snap.Body
	}
	res, err := tx.ExecContext(ctx, `UPDATE `+floorMinimalTable+
		` SET status = 1, response_status = ?, response_headers = ?, response_body = ?`+
		` WHERE scope = ? AND idempotency_key = ? AND locked_by = ? AND status = 0`, status, headers, body, l.Scope, l.Key, l.Owner)
	if err != nil {
		return idempotency.Lease{}, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return idempotency.Lease{}, idempotency.ErrLeaseLost
	}
	l.Version++
	return l, nil
}

// errMinimalOnly refuses what minimalStore does not measure: the real
// store's other writes would touch the real table, not the minimal one.
var errMinimalOnly = errors.New("idembench: the minimal record serves new keys only")

func (minimalStore) Finish(context.Context, idempotency.Lease, idempotency.Status, *idempotency.Snapshot, time.Duration) (idempotency.Lease, error) {
	return idempotency.Lease{}, errMinimalOnly
}

func (minimalStore) Release(context.Context, idempotency.Lease) error { return errMinimalOnly }

func (minimalStore) Extend(context.Context, idempotency.Lease, time.Duration) (idempotency.Lease, error) {
	return idempotency.Lease{}, errMinimalOnly
}

func (minimalStore) InsertFinal(context.Context, *sql.Tx, idempotency.Claim, idempotency.Status, *idempotency.Snapshot) error {
	return errMinimalOnly
}

func (minimalStore) TakeOver(context.Context, idempotency.Claim, idempotency.Lease) (idempotency.Lease, error) {
	return idempotency.Lease{}, errMinimalOnly
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
	b.WriteString("The create transaction and the record statements of the real MySQL store, driven in closed loop at the database without HTTP, each variant in slices alternating with the bare create (B0 first and last). CPU is per request: `db` is mariadbd, `go` this process (driver and load). \"claim only\" claims the record and never finishes it: not a protocol, the cost of the durable claim alone; \"batched claims\" shares one multi-row INSERT and one commit among the claims that arrive while the previous batch is in flight; \"minimal record\" is claim-first on the smallest record a fenced claim can have (the key, a status and the owner: no snapshot, no secondary index), the floor of the mode's shape whatever the layout.\n\n")
	b.WriteString("| variant | c | req/s | /B0 | P99 ms | /B0 | db CPU ms/req | B0's | go CPU ms/req | B0's | round trips/req | fsync/req |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var b0 *Point
	for _, p := range pts {
		if p.Bench == "B0" {
			b0 = p
			continue
		}
		if b0 == nil || p.BaselineRPS == 0 || p.Bench != "B1" {
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | **%.2f** | %.2f | %.2f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |\n",
			p.Variant, p.Concurrency, p.RPS, p.RPS/p.BaselineRPS, p.P99, p.P99/p.BaselineP99,
			p.Server["cpu_db_ms_per_req"], b0.Server["cpu_db_ms_per_req"],
			p.Server["cpu_self_ms_per_req"], b0.Server["cpu_self_ms_per_req"],
			p.Server["round_trips"], p.Server["fsyncs"])
	}
	var overHTTP []*Point
	for _, p := range pts {
		if p.Bench == "H1" && p.BaselineRPS > 0 {
			overHTTP = append(overHTTP, p)
		}
	}
	if len(overHTTP) == 0 {
		return
	}
	b.WriteString("\nThe same over HTTP, as B1 measures it: the example service in claim-first with the real record, with a store whose claim and finish touch the minimal record instead, and with one that also writes the fingerprint and the answer there (what a 409 and a replay need; no timestamps, lease version or secondary index), each alternating with the bare create served the same way (H0).\n\n")
	b.WriteString("| over HTTP | c | req/s | /H0 | P99 ms | /H0 | db CPU ms/req | go CPU ms/req | round trips/req |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range overHTTP {
		fmt.Fprintf(b, "| %s | %d | %.0f | **%.2f** | %.2f | %.2f | %.3f | %.3f | %.2f |\n",
			p.Variant, p.Concurrency, p.RPS, p.RPS/p.BaselineRPS, p.P99, p.P99/p.BaselineP99,
			p.Server["cpu_db_ms_per_req"], p.Server["cpu_self_ms_per_req"], p.Server["round_trips"])
	}
	b.WriteString("\n")
}
