package queue_test

import (
	"context"
	"database/sql"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/queue"
)

// testBundle is a Processor over a fresh MariaDB database whose handler
// writes one row per key to the table effect and answers what the test
// says, with fake deliveries that record how they were settled.
type testBundle struct {
	db  *sql.DB
	mw  *idempotency.Middleware
	p   *queue.Processor
	cfg queue.Config

	mu     sync.Mutex
	status map[string]int // the handler's answer by key; 201 unless set
	runs   map[string]int
	txs    []*sql.Tx
}

// setup builds the bundle; edit changes the queue's configuration.
func setup(t *testing.T, mcfg idempotency.Config, edit func(*queue.Config)) *testBundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	_, err := db.Exec(`CREATE TABLE effect (scope VARCHAR(64), k VARCHAR(64), PRIMARY KEY (scope, k))`)
	require.NoError(t, err)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &mcfg)
	require.NoError(t, err)
	return build(t, db, mw, edit)
}

func build(t *testing.T, db *sql.DB, mw *idempotency.Middleware, edit func(*queue.Config)) *testBundle {
	t.Helper()
	b := &testBundle{db: db, mw: mw, status: map[string]int{}, runs: map[string]int{}}
	b.cfg = queue.Config{
		Middleware: mw, Route: "POST /orders", ScopeHeader: "X-User-ID",
		RetryDelay: 250 * time.Millisecond, Backoff: queue.Backoff{Initial: time.Second, Max: 4 * time.Second},
		MaxDeliveries: 3,
		Handler: func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
			scope, key, ok := idempotency.KeyFromContext(ctx)
			if !ok { // unprotected
				key, _ = m.HeaderValue("Idempotency-Key")
				scope, _ = m.HeaderValue("X-User-ID")
			}
			b.mu.Lock()
			b.runs[key]++
			b.txs = append(b.txs, tx)
			status := b.status[key]
			b.mu.Unlock()
			if status == 0 {
				status = http.StatusCreated
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO effect (scope, k) VALUES (?, ?)`, scope, key); err != nil {
				return idempotency.Result{Status: http.StatusServiceUnavailable}
			}
			return idempotency.Result{Status: status, Header: map[string][]string{"Content-Type": {"application/json"},
				"Location": {"/orders/" + key}}, Body: []byte(`{"key":"` + key + `"}`)}
		},
	}
	if edit != nil {
		edit(&b.cfg)
	}
	p, err := queue.New("orders.create", b.cfg)
	require.NoError(t, err)
	b.p = p
	return b
}

func (b *testBundle) answer(key string, status int) {
	b.mu.Lock()
	b.status[key] = status
	b.mu.Unlock()
}

func (b *testBundle) runCount(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[key]
}

func (b *testBundle) effects(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM effect WHERE k = ?`, key).Scan(&n))
	return n
}

// process does ds in one call (one batch) and returns them.
func (b *testBundle) process(ds ...*fakeDelivery) []*fakeDelivery {
	qs := make([]queue.Delivery, len(ds))
	for i, d := range ds {
		qs[i] = d
	}
	b.p.Process(context.Background(), qs)
	return ds
}

// msg is a message of user 7 with key header key (none if ""), body
// body, on its delivery-th delivery.
func msg(key, body string, delivery int) *fakeDelivery {
	m := &queue.Message{Source: "orders.create", Header: map[string][]string{"X-User-ID": {"7"}},
		Body: []byte(body), Delivery: delivery}
	if key != "" {
		m.Header["Idempotency-Key"] = []string{key}
	}
	return &fakeDelivery{m: m}
}

// fakeDelivery records how a delivery was settled. onAck, when set, runs
// inside Ack, before it is counted.
type fakeDelivery struct {
	m *queue.Message

	mu       sync.Mutex
	acks     int
	naks     []time.Duration
	dead     []map[string]string
	replies  []queue.Reply
	replyErr error
	deadErr  error
	onAck    func()
}

func (d *fakeDelivery) Message() *queue.Message { return d.m }

func (d *fakeDelivery) Ack(context.Context) error {
	if d.onAck != nil {
		d.onAck()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.acks++
	return nil
}

func (d *fakeDelivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.naks = append(d.naks, delay)
	return nil
}

func (d *fakeDelivery) DeadLetter(_ context.Context, h map[string]string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.deadErr != nil {
		return d.deadErr
	}
	d.dead = append(d.dead, h)
	return nil
}

func (d *fakeDelivery) Reply(_ context.Context, r queue.Reply) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.replyErr != nil {
		return d.replyErr
	}
	d.replies = append(d.replies, r)
	return nil
}

// settled says how d was settled: "ack", "nak <delay>" or "dead-letter
// <reason>", with every settlement it got.
func (d *fakeDelivery) settled() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for range d.acks {
		out = append(out, "ack")
	}
	for _, delay := range d.naks {
		out = append(out, "nak "+delay.String())
	}
	for _, h := range d.dead {
		out = append(out, "dead-letter "+h[queue.ReasonHeader])
	}
	return out
}

// redeliver is the same message delivered again.
func (d *fakeDelivery) redeliver() *fakeDelivery {
	m := *d.m
	m.Delivery++
	return &fakeDelivery{m: &m}
}

// sqlOpenUnreachable opens a MySQL pool on a port nothing listens on.
func sqlOpenUnreachable(t *testing.T) (*sql.DB, error) {
	cfg := testdb.BaseConfig(t)
	cfg.Addr = frontendtest.ClosedAddr(t)
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err == nil {
		t.Cleanup(func() { db.Close() })
	}
	return db, err
}
