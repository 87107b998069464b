package frontendtest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// run runs the specs, each in parallel with the others.
func (s *suite) run(t *testing.T) {
	specs := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"AStormOfOneKey_ExecutesOnce_EveryAnswerTheFirst", s.storm},
		{"ARetry_ReplaysTheFirstAnswer", s.replay},
		{"TheKeyWithOtherFields_IsAConflict_NeverExecuted", s.conflict},
		{"ABusinessRejection_IsRecordedAndReplayed", s.rejection},
		{"ADuplicateOfAnActionInFlight_IsInProgressOrWaitsNeverExecutes", s.inProgress},
		{"AnUnreachableStore_IsAnsweredRetryably_NothingRuns", s.unreachable},
		{"ACrashedAttemptsClaim_IsTakenOverAndExecutedOnce", s.crashed},
		{"ARunTheDatabaseRolledBack_NeverMakesASecondOrder", s.rolledBack},
		{"AnOversizedRequest_IsRefusedAndWritesNothing", s.oversized},
		{"NoKeyOrABadKey_IsRefusedAndWritesNothing", s.badKey},
	}
	if s.mode == idempotency.ModeClaimFirst { // single-phase has no PROCESSING record to wait on
		specs = append(specs, struct {
			name string
			fn   func(t *testing.T)
		}{"AWaitingDuplicate_WaitsNoLongerThanInFlightWait", s.boundedWait})
	}
	for _, spec := range specs {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			spec.fn(t)
		})
	}
}

// requireSame fails unless every answer is the first answer's: the same
// Raw, marked a replay or not.
func requireSame(t *testing.T, first Answer, others ...Answer) {
	t.Helper()
	for i, a := range others {
		require.NoError(t, a.Err, "answer %d", i)
		require.Equal(t, first.Raw, a.Raw, "answer %d is not the first answer:\nfirst: %s\nthis:  %s", i, first, a)
	}
}

func (s *suite) storm(t *testing.T) {
	user, key := s.user(), "storm"
	const n = 32
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = asClient(t, s.front, create(user, key, 1))
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, s.orders(t, s.env, user, key), "one order for %d concurrent requests of one key", n)
	created := 0
	for i, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, "request %d, retried as a client: %s", i, a)
		if !a.Replayed {
			created++
		}
	}
	require.Equal(t, 1, created, "exactly one answer is the execution's, the others replays")
	requireSame(t, answers[0], answers[1:]...)
}

func (s *suite) replay(t *testing.T) {
	user, key := s.user(), "replay"
	first := s.front.Create(context.Background(), create(user, key, 2))
	require.Equal(t, http.StatusCreated, first.Status, "%s", first)
	require.False(t, first.Replayed, "the first answer is the execution's")
	require.NotEmpty(t, first.OrderNo)
	for range 2 {
		again := s.front.Create(context.Background(), create(user, key, 2))
		require.True(t, again.Replayed, "a retry is a replay: %s", again)
		requireSame(t, first, again)
	}
	require.Equal(t, 1, s.orders(t, s.env, user, key))
}

func (s *suite) conflict(t *testing.T) {
	user, key := s.user(), "conflict"
	first := s.front.Create(context.Background(), create(user, key, 1))
	require.Equal(t, http.StatusCreated, first.Status, "%s", first)
	executed := s.hooks.executions(key)
	changed := s.front.Create(context.Background(), create(user, key, 3))
	require.Equal(t, http.StatusConflict, changed.Status, "the same key with another quantity: %s", changed)
	require.Equal(t, idempotency.ProblemKeyReused, changed.Kind)
	require.False(t, changed.retryable(), "a conflict is final: %s", changed)
	require.Equal(t, executed, s.hooks.executions(key), "the changed request never executed")
	require.Equal(t, 1, s.orders(t, s.env, user, key))
	requireSame(t, first, s.front.Create(context.Background(), create(user, key, 1)))
}

func (s *suite) rejection(t *testing.T) {
	user, key := s.user(), "rejection"
	unknown := Request{User: user, Key: key, SKU: 999, Quantity: 1}
	first := s.front.Create(context.Background(), unknown)
	require.Equal(t, http.StatusUnprocessableEntity, first.Status, "an unknown SKU is the service's final refusal: %s", first)
	require.Equal(t, orderservice.ProblemUnknownSKU, first.Kind)
	again := s.front.Create(context.Background(), unknown)
	require.True(t, again.Replayed, "the refusal is recorded: %s", again)
	requireSame(t, first, again)
	other := s.front.Create(context.Background(), create(user, key, 1))
	require.Equal(t, idempotency.ProblemKeyReused, other.Kind, "a refused key is still the refused action's: %s", other)
	require.Zero(t, s.orders(t, s.env, user, key))
}

// inProgress holds the first execution of a key inside its transaction
// and sends a duplicate. Claim-first answers it in progress at once, while
// the first is still held; single-phase executes it too, and it waits on
// the first's uncommitted rows and replays, or is answered in progress.
// Either way it never makes a second order, and a retry replays the first.
func (s *suite) inProgress(t *testing.T) {
	user, key := s.user(), "in-flight"
	g := holdFirstRun(t, s.hooks, key)
	firstc := make(chan Answer, 1)
	go func() { firstc <- s.front.Create(context.Background(), create(user, key, 1)) }()
	<-g.entered

	dupc := make(chan Answer, 1)
	go func() { dupc <- s.front.Create(context.Background(), create(user, key, 1)) }()
	var dup Answer
	if s.mode == idempotency.ModeClaimFirst {
		dup = <-dupc // answered while the first is held
		g.release()
		require.Equal(t, http.StatusConflict, dup.Status, "%s", dup)
		require.Equal(t, idempotency.ProblemInProgress, dup.Kind)
		require.True(t, dup.RetryAfter, "in progress says when to retry: %s", dup)
	} else {
		g.release()
		dup = <-dupc
	}
	first := <-firstc
	require.Equal(t, http.StatusCreated, first.Status, "%s", first)
	if dup.Status == http.StatusCreated {
		require.True(t, dup.Replayed, "%s", dup)
		requireSame(t, first, dup)
	} else {
		require.True(t, dup.retryable(), "a duplicate is a replay or in progress: %s", dup)
	}
	requireSame(t, first, asClient(t, s.front, create(user, key, 1)))
	require.Equal(t, 1, s.orders(t, s.env, user, key))
}

// boundedWait: with InFlightWait, a duplicate waits for the first to finish,
// but no longer: while the first is held past the wait, the duplicate is
// answered in progress (claim-first; single-phase has no PROCESSING record
// to wait on).
func (s *suite) boundedWait(t *testing.T) {
	env, _ := s.newEnv(t, idempotency.Config{Mode: s.mode, InFlightWait: 300 * time.Millisecond}, nil)
	front := s.build(t, env)
	user, key := s.user(), "bounded-wait"
	g := holdFirstRun(t, s.hooks, key)
	firstc := make(chan Answer, 1)
	go func() { firstc <- front.Create(context.Background(), create(user, key, 1)) }()
	<-g.entered
	dup, unavailable := untilStoreAnswers(t, front, create(user, key, 1)) // the first is held until after it
	g.release()
	require.Equal(t, idempotency.ProblemInProgress, dup.Kind,
		"the wait ended while the first was held (after %d store-unavailable answers): %s", unavailable, dup)
	require.True(t, dup.RetryAfter, "%s", dup)
	first := <-firstc
	require.Equal(t, http.StatusCreated, first.Status, "%s", first)

	// Now the duplicate's wait ends with the first's answer.
	key2 := "bounded-wait-replayed"
	g2 := holdFirstRun(t, s.hooks, key2)
	go func() { firstc <- front.Create(context.Background(), create(user, key2, 1)) }()
	<-g2.entered
	dupc := make(chan Answer, 1)
	go func() { dupc <- front.Create(context.Background(), create(user, key2, 1)) }()
	g2.release()
	first2, dup2 := <-firstc, <-dupc
	require.Equal(t, http.StatusCreated, first2.Status, "%s", first2)
	if !dup2.retryable() { // it may have arrived after the wait ended
		requireSame(t, first2, dup2)
	}
	require.Equal(t, 1, s.orders(t, env, user, key2))
}

func (s *suite) unreachable(t *testing.T) {
	env, _ := s.newEnv(t, idempotency.Config{Mode: s.mode}, s.db.Unreachable(t))
	front := s.build(t, env)
	user, key := s.user(), "unreachable"
	a := front.Create(context.Background(), create(user, key, 1))
	require.Equal(t, http.StatusServiceUnavailable, a.Status, "a fault of the infrastructure: %s", a)
	require.True(t, a.RetryAfter, "it says when to retry: %s", a)
	require.True(t, a.retryable(), "%s", a)
	require.Zero(t, s.hooks.executions(key), "nothing ran")
	require.Zero(t, s.orders(t, env, user, key))
}

// crashed: an attempt claimed the key and died (its process was killed):
// its PROCESSING record is left under a lease that expires by the
// database's clock. The next request takes the key over and executes once.
func (s *suite) crashed(t *testing.T) {
	user, key := s.user(), "crashed"
	r := create(user, key, 1)
	fp, err := s.env.Service.Middleware("create_order").FingerprintJSON(
		fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":%d}`, r.User, r.SKU, r.Quantity))
	require.NoError(t, err)
	ctx := context.Background()
	scope := strconv.FormatInt(user, 10)
	_, err = s.store.Claim(ctx, idempotency.Claim{Scope: scope, Key: key, Fingerprint: fp, Owner: "killed/1",
		Lease: 10 * time.Millisecond, Retention: time.Hour})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, err := s.store.Lookup(ctx, scope, key)
		return err == nil && rec.LeaseExpired
	}, 30*time.Second, 10*time.Millisecond, "the dead attempt's lease never expired by the database's clock")

	a := asClient(t, s.front, r)
	require.Equal(t, http.StatusCreated, a.Status, "the crashed key is taken over (the front-end's fingerprint must be the HTTP route's): %s", a)
	require.False(t, a.Replayed, "it executed: %s", a)
	require.Equal(t, 1, s.orders(t, s.env, user, key))
	rec, err := s.store.Lookup(ctx, scope, key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StatusDone, rec.Status)
	require.NotEqual(t, "killed/1", rec.Owner)
	requireSame(t, a, s.front.Create(ctx, r))
}

// rolledBack: the database rolls back the run that would have finished
// the record (a deadlock at its record). Single-phase runs the action again
// within the request; claim-first answers 503 with a retry hint, and the
// client's retry executes. One order either way. A consumer that took the
// message in a batch does it again alone once the batch's transaction
// fails (DoBatch): for single-phase that is the second run; claim-first,
// the fault holds for the attempt's every finish, so the answer is the
// same 503 whether or not the message came with others.
func (s *suite) rolledBack(t *testing.T) {
	user, key := s.user(), "rolled-back"
	s.store.failNext(key, 1)
	a := s.front.Create(context.Background(), create(user, key, 1))
	if s.mode == idempotency.ModeSinglePhase {
		require.Equal(t, http.StatusCreated, a.Status, "single-phase ran the action again: %s", a)
		require.False(t, a.Replayed)
		require.Equal(t, 2, s.hooks.executions(key), "two runs, the first rolled back")
	} else {
		require.Equal(t, http.StatusServiceUnavailable, a.Status, "%s", a)
		require.True(t, a.retryable(), "%s", a)
		a = asClient(t, s.front, create(user, key, 1))
		require.Equal(t, http.StatusCreated, a.Status, "the retry executes: %s", a)
	}
	require.Equal(t, 1, s.orders(t, s.env, user, key))
	requireSame(t, a, s.front.Create(context.Background(), create(user, key, 1)))
}

func (s *suite) oversized(t *testing.T) {
	user, key := s.user(), "oversized"
	big := create(user, key, 1)
	big.Oversize = true
	a := s.front.Create(context.Background(), big)
	require.Contains(t, []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge}, a.Status, "%s", a)
	require.Contains(t, []string{idempotency.ProblemBodyTooLarge, idempotency.ProblemInvalidBody}, a.Kind, "%s", a)
	require.False(t, a.retryable(), "%s", a)
	require.Zero(t, s.records(t, s.env, user, key), "nothing recorded")
	ok := s.front.Create(context.Background(), create(user, key, 1))
	require.Equal(t, http.StatusCreated, ok.Status, "the key is still new: %s", ok)
	require.False(t, ok.Replayed)
}

func (s *suite) badKey(t *testing.T) {
	user := s.user()
	for _, tc := range []struct{ key, kind string }{
		{"", idempotency.ProblemMissingKey},
		{"two words", idempotency.ProblemInvalidKey},
	} {
		a := s.front.Create(context.Background(), create(user, tc.key, 1))
		require.Equal(t, http.StatusBadRequest, a.Status, "key %q: %s", tc.key, a)
		require.Equal(t, tc.kind, a.Kind, "key %q: %s", tc.key, a)
		require.False(t, a.retryable())
	}
	var n int
	err := s.env.DB.QueryRow("SELECT COUNT(*) FROM purchase_order WHERE user_id = " + strconv.FormatInt(user, 10)).Scan(&n)
	require.NoError(t, err)
	require.Zero(t, n)
}

// gate holds the first run of a key inside its transaction until released.
type gate struct {
	entered  chan struct{} // closed when the first run is held
	released chan struct{}
	once     sync.Once
}

// holdFirstRun holds key's first run until release, or until t ends (so
// that a failing spec never leaves a run, and its server, hanging).
func holdFirstRun(t *testing.T, h *hooks, key string) *gate {
	g := &gate{entered: make(chan struct{}), released: make(chan struct{})}
	h.set(key, func(ctx context.Context, run int) error {
		if run == 1 {
			close(g.entered)
			<-g.released
		}
		return nil
	})
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.released) }) }
