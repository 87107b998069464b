package chaintest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// Front is a front-end's side of the differential test: its framework
// serving a chain alone, and serving it behind a Middleware.
type Front struct {
	Name  string
	Rules Rules
	// Plain serves ch with the framework alone, Outer then Inner, in front
	// of nothing. Its orders go into a transaction the test commits when
	// the chain answered 2xx or 3xx.
	Plain func(ch Chain) http.Handler
	// Protected serves ch with Inner behind mw.
	Protected func(ch Chain, mw *idempotency.Middleware) http.Handler
	// RefusesReruns: the front-end refuses a run after a run that aborted
	// (RerunRefused); it reports aborted runs with Exchange.Aborted.
	RefusesReruns bool
	// Divergences the front-end documents besides PanicAnsweredByMiddleware.
	Divergences []Divergence
}

// Options configure a Run.
type Options struct {
	Mode idempotency.Mode
	// Chains is how many chains to check. Defaults to $CHAINTEST_CHAINS,
	// else 3000: 1000 under the race detector, which runs a chain several
	// times slower (the chains' subject is answers, not data races, and
	// every run draws new ones), 300 with -short.
	Chains int
	// Seed draws the chains. Defaults to $CHAINTEST_SEED, else the clock.
	Seed int64
	// Workers check chains in parallel. Defaults to 4.
	Workers int
}

func (o Options) withDefaults(t testing.TB) Options {
	if o.Chains == 0 {
		o.Chains = 3000
		if raceDetector {
			o.Chains = 1000
		}
		if testing.Short() {
			o.Chains = 300
		}
		if v := os.Getenv("CHAINTEST_CHAINS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("chaintest: CHAINTEST_CHAINS=%q: want a positive number", v)
			}
			o.Chains = n
		}
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()
		if v := os.Getenv("CHAINTEST_SEED"); v != "" {
			seed, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("chaintest: CHAINTEST_SEED=%q: want an integer", v)
			}
			o.Seed = seed
		}
	}
	if o.Workers == 0 {
		o.Workers = 8
	}
	return o
}

// Report counts what a Run exercised.
type Report struct {
	Chains    int
	Committed int // chains whose protected answer committed an order
	// Reruns: requests whose chain ran more than once; RerunsBy counts
	// them by how the test forced it.
	Reruns      int
	RerunsBy    map[Rerun]int
	Replays     int            // final answers replayed and compared
	Divergences map[string]int // documented answers given, by name
	Elapsed     time.Duration
}

func (r *Report) String() string {
	return fmt.Sprintf("%d chains in %v: %d committed, %d ran again (%d after a rollback, %d renewing a key read first, %d renewing a key met by the insert), %d replays; documented answers: %v",
		r.Chains, r.Elapsed.Round(time.Millisecond), r.Committed, r.Reruns, r.RerunsBy[RerunRollback], r.RerunsBy[RerunRenewal],
		r.RerunsBy[RerunRenewalAtInsert], r.Replays, r.Divergences)
}

// Run checks o.Chains generated chains on f against f's framework alone and
// fails t for each chain that differs (the first ones shrunk), printing the
// seed that draws them again.
func Run(t testing.TB, f Front, o Options) *Report {
	t.Helper()
	o = o.withDefaults(t)
	s := newSuite(t, f, o)
	rules := f.Rules
	rules.Reruns = rules.Reruns && o.Mode == idempotency.ModeSinglePhase
	chains := Generate(o.Seed, o.Chains, rules)
	t.Logf("%s, %s: %d chains from CHAINTEST_SEED=%d", f.Name, modeName(o.Mode), len(chains), o.Seed)

	report := &Report{Chains: len(chains), RerunsBy: map[Rerun]int{}, Divergences: map[string]int{}}
	var (
		mu      sync.Mutex
		failed  []failure
		nFailed int
		wg      sync.WaitGroup
	)
	work := make(chan Chain)
	start := time.Now()
	for range o.Workers {
		wg.Go(func() {
			for ch := range work {
				out, err := s.check(ch)
				mu.Lock()
				if err != nil {
					nFailed++
					if len(failed) < maxFailuresKept {
						failed = append(failed, failure{ch, err})
					}
				} else {
					out.count(report)
				}
				mu.Unlock()
			}
		})
	}
	for _, ch := range chains {
		work <- ch
	}
	close(work)
	wg.Wait()
	report.Elapsed = time.Since(start)
	t.Logf("%s, %s: %v", f.Name, modeName(o.Mode), report)

	slices.SortFunc(failed, func(a, b failure) int { return a.chain.ID - b.chain.ID })
	for i, fl := range failed {
		msg := fmt.Sprintf("%v\n\t%v", fl.chain, fl.err)
		if i < maxFailuresShrunk {
			if small, err := s.shrink(fl.chain); small.ID >= 0 {
				msg += fmt.Sprintf("\nshrunk to\n\t%v\n\t%v", small, err)
			} else {
				msg += "\n(it does not fail alone: it failed beside the chains checked with it)"
			}
		}
		t.Errorf("%s, %s: %s\n(%d of %d chains differ; draw them again with CHAINTEST_SEED=%d CHAINTEST_CHAINS=%d)",
			f.Name, modeName(o.Mode), msg, nFailed, len(chains), o.Seed, o.Chains)
	}
	if nFailed == 0 && len(chains) >= minChainsForCoverage {
		requireCoverage(t, f, o, report)
	}
	return report
}

const (
	maxFailuresKept      = 10
	maxFailuresShrunk    = 3
	minChainsForCoverage = 2000
)

type failure struct {
	chain Chain
	err   error
}

// requireCoverage fails a run that checked many chains but few of the
// cases it exists for: runs again, and the refusals a front-end promises.
func requireCoverage(t testing.TB, f Front, o Options, r *Report) {
	t.Helper()
	if r.Committed < r.Chains/10 {
		t.Errorf("%s, %s: only %d of %d chains committed an order: the generator no longer makes what refusals must prevent", f.Name, modeName(o.Mode), r.Committed, r.Chains)
	}
	if !f.Rules.Reruns || o.Mode != idempotency.ModeSinglePhase {
		return
	}
	// Far below what a run gives (the rarest, a key read first whose run
	// answered a non-final status, is about 1 in 150), so that the check
	// never fails by chance.
	for _, force := range []Rerun{RerunRollback, RerunRenewal, RerunRenewalAtInsert} {
		if r.RerunsBy[force] < r.Chains/1000 {
			t.Errorf("%s, %s: %d of %d chains ran again by %s: want at least 1 in 1000 to say anything about that way of running again",
				f.Name, modeName(o.Mode), r.RerunsBy[force], r.Chains, force)
		}
	}
	if refused := r.Divergences[RerunRefused.Name]; f.RefusesReruns && (refused == 0 || refused == r.Reruns) {
		t.Errorf("%s, %s: %d of %d runs again were refused: want some refused (after an aborted run) and some run", f.Name, modeName(o.Mode), refused, r.Reruns)
	}
}

// suite is one Run's database, middleware and request numbering.
type suite struct {
	front   Front
	db      *sql.DB
	mw      *idempotency.Middleware
	allowed []Divergence
	seq     atomic.Int64
}

func newSuite(t testing.TB, f Front, o Options) *suite {
	t.Helper()
	db, _ := testdb.MySQL(t)
	if err := idempotency.Migrate(context.Background(), db); err != nil {
		t.Fatalf("chaintest: migrate: %v", err)
	}
	if _, err := db.Exec("CREATE TABLE chaintest_lock (tag VARCHAR(64) NOT NULL PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatalf("chaintest: %v", err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Mode:          o.Mode,
		ReplayHeaders: []string{"X-Chain"},
		Observer:      runObserver{},
		InstanceID:    "chaintest",
	})
	if err != nil {
		t.Fatalf("chaintest: %v", err)
	}
	allowed := append([]Divergence{PanicAnsweredByMiddleware}, f.Divergences...)
	if f.RefusesReruns {
		allowed = append(allowed, RerunRefused)
	}
	return &suite{front: f, db: db, mw: mw, allowed: allowed}
}

// outcome is what one chain's check exercised.
type outcome struct {
	force      Rerun
	runs       int
	committed  bool
	divergence string
	replayed   bool
}

func (o outcome) count(r *Report) {
	if o.committed {
		r.Committed++
	}
	if o.runs > 1 {
		r.Reruns++
		r.RerunsBy[o.force]++
	}
	if o.divergence != "" {
		r.Divergences[o.divergence]++
	}
	if o.replayed {
		r.Replays++
	}
}

// check serves ch plain and protected and compares: the protected request
// against the plain chain standing for its last run, then a replay of a
// final answer against the first.
func (s *suite) check(ch Chain) (outcome, error) {
	plain1, err := s.plain(ch, 1)
	if err != nil {
		return outcome{}, err
	}
	force := ch.Rerun
	if force == RerunRollback && !commits(plain1.Status) {
		force = RerunNone // a run that does not commit never inserts its record in its transaction
	}
	key := fmt.Sprintf("chain-%d-%d", ch.ID, s.seq.Add(1))
	got, err := s.protected(ch, key, force)
	if err != nil {
		return outcome{}, err
	}
	want := plain1
	if got.Runs > 1 {
		if want, err = s.plain(ch, got.Runs); err != nil {
			return outcome{}, err
		}
	}
	div, err := compare(got, want, s.allowed)
	if err != nil {
		return outcome{}, fmt.Errorf("%w\n\tprotected:    %v\n\tplain, run %d: %v", err, got, want.Runs, want)
	}
	out := outcome{force: force, runs: got.Runs, committed: len(got.Orders) > 0, divergence: div}
	if div == "" && got.Runs > 0 && idempotency.DefaultIsFinal(got.Status) { // the middleware answered it: a retry replays it
		replay, err := s.protected(ch, key, RerunNone)
		if err != nil {
			return outcome{}, err
		}
		if err := compareReplay(replay, got); err != nil {
			return outcome{}, fmt.Errorf("%w\n\treplay: %v\n\tfirst:  %v", err, replay, got)
		}
		out.replayed = true
	}
	return out, nil
}

func commits(status int) bool { return status >= 200 && status < 400 }

// plain serves ch with the framework alone, standing for run: its
// transaction commits if the chain answered 2xx or 3xx.
func (s *suite) plain(ch Chain, run int) (Result, error) {
	ex := s.exchange(&ch, "q")
	ex.run = run
	res, err := s.serve(s.front.Plain(ch), ex, "")
	if ex.plainTx != nil {
		if err == nil && commits(res.Status) {
			err = ex.plainTx.Commit()
		} else {
			_ = ex.plainTx.Rollback()
		}
	}
	if err != nil {
		return Result{}, err
	}
	res.Runs = run
	res.Orders, err = s.orders(ex)
	return res, err
}

// protected serves ch behind the middleware under key, forcing a run again
// as force says.
func (s *suite) protected(ch Chain, key string, force Rerun) (Result, error) {
	ex := s.exchange(&ch, "p")
	switch force {
	case RerunRollback:
		blocker, err := s.holdRecord(key, ex.tag)
		if err != nil {
			return Result{}, err
		}
		ex.blocker = blocker
	case RerunRenewal:
		if err := s.storeExpired(context.Background(), key); err != nil {
			return Result{}, err
		}
	case RerunRenewalAtInsert:
		ex.expireAtFinalize = func(ctx context.Context) error { return s.storeExpired(ctx, key) }
	}
	res, err := s.serve(s.front.Protected(ch, s.mw), ex, key)
	ex.mu.Lock()
	ex.releaseBlocker()
	forceErr := ex.forceErr
	ex.mu.Unlock()
	if err == nil && forceErr != nil {
		err = fmt.Errorf("chaintest: could not make the database roll the first run back: %w", forceErr)
	}
	if err != nil {
		return Result{}, err
	}
	res.Runs, res.AbortedBefore = ex.Run(), ex.abortedBefore()
	res.Orders, err = s.orders(ex)
	return res, err
}

func (s *suite) exchange(ch *Chain, side string) *Exchange {
	return &Exchange{chain: ch, tag: fmt.Sprintf("%s%d", side, s.seq.Add(1)), db: s.db, aborted: map[int]bool{}}
}

// serve sends the chain's request to h in process and reads the answer as
// a server would send it (serverRecorder).
func (s *suite) serve(h http.Handler, ex *Exchange, key string) (res Result, err error) {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(fmt.Sprintf(`{"chain":%d}`, ex.chain.ID)))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req = req.WithContext(withExchange(req.Context(), ex))
	rec := newServerRecorder()
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("a panic escaped the framework: %v", v)
		}
	}()
	h.ServeHTTP(rec, req)
	status, header, body := rec.result()
	res = Result{Status: status, Header: http.Header{}, Body: bytes.Clone(body), Trace: ex.trace(),
		Replayed: header.Get("Idempotent-Replayed")}
	for _, h := range comparedHeaders {
		if v := header.Values(h); len(v) > 0 {
			res.Header[h] = v
		}
	}
	return res, nil
}

// orders returns the committed orders of ex's request, as "run/step".
func (s *suite) orders(ex *Exchange) ([]string, error) {
	ex.mu.Lock()
	created, tag := ex.created, ex.tag
	ex.mu.Unlock()
	if !created {
		return nil, nil // no step wrote one
	}
	rows, err := s.db.Query("SELECT order_no FROM purchase_order WHERE order_no LIKE ? ORDER BY order_no", tag+"/%")
	if err != nil {
		return nil, fmt.Errorf("chaintest: read orders: %w", err)
	}
	defer rows.Close()
	var orders []string
	for rows.Next() {
		var no string
		if err := rows.Scan(&no); err != nil {
			return nil, err
		}
		orders = append(orders, strings.TrimPrefix(no, tag+"/"))
	}
	return orders, rows.Err()
}

func modeName(m idempotency.Mode) string {
	if m == idempotency.ModeSinglePhase {
		return "single-phase"
	}
	return "claim-first"
}
