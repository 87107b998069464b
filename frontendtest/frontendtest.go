// Package frontendtest is the conformance suite every front-end of the
// protocol must pass, as storetest is for stores: net/http's Handler, the
// gin and echo adapters, the gRPC interceptor and the queue consumers. The
// behaviour a client relies on lives here once, not copied into each
// front-end's tests.
//
// A front-end's test calls Exercise with a Database (MySQL here; PostgreSQL
// is pgtest.Database in the postgres module) and a Build that serves the
// example order service's create action (orderservice.Service.Create, the
// service's create_order Middleware) over the front-end's transport, under
// the HTTP route's fingerprint: the fields orderservice.CreateFields of
// "POST /orders". The suite runs in both modes and checks what must hold
// under any timing: one order per key, every answer for a key the first
// answer, a changed request refused and never executed, only the
// contract's answers on the way (in progress and infrastructure faults say
// when to retry), and bad input refused before anything is written.
//
// A front-end of payment providers' events (payment.Webhook, as
// orderservice.Service.PaymentWebhook serves it; a queue consumer of the
// events an event bridge forwards) passes ExercisePayments too, with a
// PaymentBuild and its provider's client (WeChatPay plays WeChat Pay v3
// over HTTP): one application per event id however many deliveries
// arrive, an id reused with another payload never applied but recorded
// as an anomaly and acknowledged, an event that cannot apply recorded and
// acknowledged, infrastructure faults answered so that the provider
// delivers again, and a callback that is not the provider's (forged,
// tampered, unsigned, stale, malformed, oversized) refused before anything
// is written.
package frontendtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// Database is an engine the suite runs on.
type Database interface {
	// Name names the engine in subtests ("mysql", "postgres").
	Name() string
	// Open returns a fresh, empty database, its idempotency store and the
	// dialect's name as orderservice knows it; it is dropped when t ends.
	Open(t *testing.T) (*sql.DB, idempotency.Store, string)
	// Unreachable returns a store of the engine over a server that does
	// not answer: every call fails as a refused connection does.
	Unreachable(t *testing.T) idempotency.Store
	// Deadlock returns the error the engine's driver reports to the victim
	// of a deadlock (MySQL 1213, PostgreSQL 40P01): the database rolled
	// the transaction back.
	Deadlock() error
}

// Env is the service a front-end serves for one part of the suite.
type Env struct {
	// Service is the order service; its create_order Middleware
	// (Service.Middleware) protects the create.
	Service *orderservice.Service
	DB      *sql.DB
	Dialect string
	Mode    idempotency.Mode
}

// Build serves env's service over the front-end's transport, for as long
// as t runs, and returns a client of it.
type Build func(t *testing.T, env *Env) Frontend

// Frontend is the front-end under test, as its client sees it.
type Frontend interface {
	// Create sends one create through the transport and returns its
	// answer in the contract's terms.
	Create(ctx context.Context, r Request) Answer
}

// Request is one create. Its business fields make the fingerprint.
type Request struct {
	User     int64  // the principal (X-User-ID, x-user-id, a header)
	Key      string // the idempotency key; "" sends none
	SKU      int64
	Quantity int
	Coupon   *int64
	// Oversize pads the request past 2 MiB with a field the fingerprint
	// does not cover (a proposed order number, a note): more than any
	// front-end's limit.
	Oversize bool
}

// Answer is a front-end's answer in the contract's terms, whatever its
// transport.
type Answer struct {
	// Status is the HTTP status, or the transport's equivalent (a gRPC
	// code's idemgrpc.HTTPStatus, a consumer's recorded status).
	Status int
	// Kind is a problem's kind (idempotency.Problem*, or the service's
	// own), "" for an order.
	Kind string
	// Replayed marks a replay of the recorded answer.
	Replayed bool
	// RetryAfter says the answer tells when to retry (Retry-After,
	// RetryInfo, a delayed redelivery).
	RetryAfter bool
	// OrderNo is the created order's number, for an order.
	OrderNo string
	// Raw is the whole answer as the transport carried it, but the replay
	// mark: a replay's Raw equals the first answer's.
	Raw string
	// Err is a transport failure (no answer at all).
	Err error
}

func (a Answer) String() string {
	if a.Err != nil {
		return "transport error: " + a.Err.Error()
	}
	return fmt.Sprintf("%d %s replayed=%v retry-after=%v order=%s raw=%.300s", a.Status, a.Kind, a.Replayed, a.RetryAfter, a.OrderNo, a.Raw)
}

// retryable reports an answer the contract lets a client retry.
func (a Answer) retryable() bool {
	return a.Err != nil || a.RetryAfter && (a.Status == 503 || (a.Status == 409 && a.Kind == idempotency.ProblemInProgress))
}

// Exercise runs the suite on db against the front-end build makes, in
// modes (both when none are given; a front-end that cannot run a handler
// again, such as gin's chain Middleware, names claim-first only).
func Exercise(t *testing.T, db Database, build Build, modes ...idempotency.Mode) {
	if len(modes) == 0 {
		modes = []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase}
	}
	names := map[idempotency.Mode]string{idempotency.ModeClaimFirst: "claim-first", idempotency.ModeSinglePhase: "single-phase"}
	for _, m := range modes {
		mode := struct {
			name string
			mode idempotency.Mode
		}{names[m], m}
		t.Run(db.Name()+"/"+mode.name, func(t *testing.T) {
			t.Parallel()
			s := newSuite(t, db, mode.mode, build)
			s.run(t)
		})
	}
}

// suite is one engine and mode: one database and one service that most
// specs share, each with users and keys of its own; the specs that need
// another configuration build their own.
type suite struct {
	db    Database
	mode  idempotency.Mode
	build Build
	env   *Env
	front Frontend
	hooks *hooks
	store *faultStore
	users atomic.Int64
}

func newSuite(t *testing.T, db Database, mode idempotency.Mode, build Build) *suite {
	s := &suite{db: db, mode: mode, build: build, hooks: &hooks{byKey: map[string]hook{}}}
	s.users.Store(100)
	s.env, s.store = s.newEnv(t, idempotency.Config{Mode: mode}, nil)
	s.front = build(t, s.env)
	return s
}

// newEnv opens a database and builds a service over it with cfg, the
// suite's hooks, and store (a fault-injecting wrapper of the database's
// when nil).
func (s *suite) newEnv(t *testing.T, cfg idempotency.Config, store idempotency.Store) (*Env, *faultStore) {
	sqlDB, dbStore, dialect := s.db.Open(t)
	require.NoError(t, orderservice.Setup(context.Background(), sqlDB, dialect))
	var fs *faultStore
	if store == nil {
		fs = &faultStore{Store: dbStore, deadlock: s.db.Deadlock(), failInserts: map[string]int{}, doomed: map[string]string{}}
		store = fs
	}
	cfg.Lease = max(cfg.Lease, 2*time.Second)
	svc, err := orderservice.New(sqlDB, orderservice.Options{
		Idempotency: true, Store: store, Dialect: dialect, Config: cfg, AfterCreate: s.hooks.run,
		PaymentEventsMode: &cfg.Mode, // the suite's mode on every route
	})
	require.NoError(t, err)
	return &Env{Service: svc, DB: sqlDB, Dialect: dialect, Mode: cfg.Mode}, fs
}

// user returns a principal no other spec uses.
func (s *suite) user() int64 { return s.users.Add(1) }

// create is a create of SKU 20001 × quantity for user under key.
func create(user int64, key string, quantity int) Request {
	return Request{User: user, Key: key, SKU: orderservice.FirstSKU, Quantity: quantity}
}

// orders counts the orders of user's key.
func (s *suite) orders(t *testing.T, env *Env, user int64, key string) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ?"
	if env.Dialect == "postgres" {
		q = "SELECT COUNT(*) FROM purchase_order WHERE scope = $1 AND idempotency_key = $2"
	}
	var n int
	require.NoError(t, env.DB.QueryRow(q, strconv.FormatInt(user, 10), key).Scan(&n))
	return n
}

// records counts the idempotency records of user's key.
func (s *suite) records(t *testing.T, env *Env, user int64, key string) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM idempotency_record WHERE scope = ? AND idempotency_key = ?"
	if env.Dialect == "postgres" {
		q = "SELECT COUNT(*) FROM idempotency_record WHERE scope = $1 AND idempotency_key = $2"
	}
	var n int
	require.NoError(t, env.DB.QueryRow(q, strconv.FormatInt(user, 10), key).Scan(&n))
	return n
}

// asClient sends r as a retrying client does: an answer the contract calls
// retryable is sent again (without waiting out Retry-After: the suite only
// needs the final answer), up to a deadline.
func asClient(t *testing.T, front Frontend, r Request) Answer {
	t.Helper()
	a, _ := resend(front, r, Answer.retryable)
	return a
}

// untilStoreAnswers sends r again while the answer is a 503 with
// Retry-After, the answer to a store the load made slow or short of
// connections, as a client does, and returns the first other answer and
// how many 503s came before it. A spec that needs the store's own verdict
// (in progress, say) asks with it.
func untilStoreAnswers(t *testing.T, front Frontend, r Request) (Answer, int) {
	t.Helper()
	return resend(front, r, func(a Answer) bool {
		return a.Err == nil && a.Status == http.StatusServiceUnavailable && a.RetryAfter
	})
}

// resend sends r until again refuses its answer, for up to a minute, and
// returns the last answer and how many came before it.
func resend(front Frontend, r Request, again func(Answer) bool) (Answer, int) {
	deadline := time.Now().Add(60 * time.Second)
	for n := 0; ; n++ {
		a := front.Create(context.Background(), r)
		if !again(a) || time.Now().After(deadline) {
			return a, n
		}
		time.Sleep(20 * time.Millisecond) // a client's pause between tries, not an interleaving
	}
}

// hook runs inside a create's transaction, after its order row is written
// (orderservice.Options.AfterCreate), for one key: run counts the key's
// executions from 1.
type hook func(ctx context.Context, run int) error

type hooks struct {
	mu    sync.Mutex
	byKey map[string]hook
	runs  map[string]int
}

func (h *hooks) set(key string, fn hook) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byKey[key] = fn
}

func (h *hooks) run(ctx context.Context) error {
	_, key, _ := idempotency.KeyFromContext(ctx)
	h.mu.Lock()
	fn := h.byKey[key]
	if h.runs == nil {
		h.runs = map[string]int{}
	}
	h.runs[key]++
	n := h.runs[key]
	h.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, n)
}

// executions is how often key's create ran to its hook.
func (h *hooks) executions(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[key]
}

// faultStore is the database's store with faults a spec arms by key: the
// record's INSERT (single-phase) of a key's next runs fails as the
// database's deadlock victim's does, its transaction rolled back; so does
// the finish (claim-first) of the key's next attempt, every time that
// attempt tries it under its claim: a batch that could not commit does
// each of its actions again alone, under the claim it holds, and the
// fault must not depend on whether the consumer took the message with
// others.
type faultStore struct {
	idempotency.Store
	deadlock    error
	mu          sync.Mutex
	failInserts map[string]int
	doomed      map[string]string // key: the owner whose every finish fails
}

func (f *faultStore) failNext(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failInserts[key] = n
}

func (f *faultStore) fail(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failInserts[key] > 0 {
		f.failInserts[key]--
		return true
	}
	return false
}

func (f *faultStore) InsertFinal(ctx context.Context, tx *sql.Tx, c idempotency.Claim, st idempotency.Status, snap *idempotency.Snapshot) error {
	if tx != nil && f.fail(c.Key) {
		return f.deadlock
	}
	return f.Store.InsertFinal(ctx, tx, c, st, snap)
}

// failFinish reports whether l's finish fails: the first finish of an
// armed key dooms its owner's.
func (f *faultStore) failFinish(l idempotency.Lease) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if owner, ok := f.doomed[l.Key]; ok {
		return owner == l.Owner
	}
	if f.failInserts[l.Key] > 0 {
		f.failInserts[l.Key]--
		f.doomed[l.Key] = l.Owner
		return true
	}
	return false
}

func (f *faultStore) FinishTx(ctx context.Context, tx *sql.Tx, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	if f.failFinish(l) {
		return idempotency.Lease{}, f.deadlock
	}
	return f.Store.FinishTx(ctx, tx, l, st, snap, retention)
}

// The faultStore keeps what the store says it holds.
func (f *faultStore) CheckText(s string) error {
	if tc, ok := f.Store.(idempotency.TextChecker); ok {
		return tc.CheckText(s)
	}
	return nil
}
