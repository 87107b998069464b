package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/obstest"
	"github.com/orderguard/idempotency/metrics"
)

// newObserver returns an Observer over a fresh pedantic registry (which
// checks every collected metric against its descriptor).
func newObserver(t *testing.T, opts ...metrics.Option) (*metrics.Observer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	obs, err := metrics.New(reg, opts...)
	require.NoError(t, err)
	return obs, reg
}

// value returns the value of the counter or gauge series name{labels}, and
// 0 if the series does not exist.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	m := find(t, reg, name, labels...)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", name)
	return 0
}

// samples returns the sample count of the histogram series name{labels},
// and 0 if the series does not exist.
func samples(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) uint64 {
	t.Helper()
	m := find(t, reg, name, labels...)
	if m == nil {
		return 0
	}
	require.NotNil(t, m.Histogram, "%s is not a histogram", name)
	return m.Histogram.GetSampleCount()
}

// find returns the series of the metric family name whose labels are the
// label name/value pairs given (exactly), or nil.
func find(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	require.Zero(t, len(labels)%2, "labels come in name/value pairs")
	want := map[string]string{}
	for i := 0; i < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// sum adds up every series of a counter family.
func sum(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var total float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func TestObserver_CountsExactlyOneFinalOutcomePerRequest_StepsAndStagesSeparately(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	s := obstest.NewService(t, obs, obstest.Options{})
	create := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 2})

	// A create, then two retries that replay it.
	status, _ := s.Do(t, obstest.Call{Tenant: "t1", Key: "k-create", Body: create})
	require.Equal(t, http.StatusCreated, status)
	for range 2 {
		status, _ = s.Do(t, obstest.Call{Tenant: "t1", Key: "k-create", Body: create})
		require.Equal(t, http.StatusCreated, status)
	}
	// The same key with another body is a conflict.
	status, _ = s.Do(t, obstest.Call{Tenant: "t1", Key: "k-create", Body: obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 3})})
	require.Equal(t, http.StatusConflict, status)
	// A duplicate of a request still executing is answered in progress; the
	// handler meanwhile holds the in-flight gauge at 1.
	blocked := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20002, Quantity: 1, Block: true})
	first := make(chan int, 1)
	go func() {
		st, _ := s.Do(t, obstest.Call{Tenant: "t1", Key: "k-slow", Body: blocked})
		first <- st
	}()
	<-s.Entered
	require.Equal(t, 1.0, value(t, reg, "idempotency_claims_in_flight", "route", obstest.RouteOrders))
	status, _ = s.Do(t, obstest.Call{Tenant: "t1", Key: "k-slow", Body: blocked})
	require.Equal(t, http.StatusConflict, status)
	s.Release()
	require.Equal(t, http.StatusCreated, <-first)
	// A business rejection is stored FAILED and replayed as such.
	reject := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20003, Quantity: 1, Reject: true})
	for range 2 {
		status, _ = s.Do(t, obstest.Call{Tenant: "t1", Key: "k-reject", Body: reject})
		require.Equal(t, http.StatusUnprocessableEntity, status)
	}
	// No key at all is invalid.
	status, _ = s.Do(t, obstest.Call{Tenant: "t1", Body: create})
	require.Equal(t, http.StatusBadRequest, status)
	// A 5xx releases the key: the retry executes (and fails) again.
	for range 2 {
		status, _ = s.Do(t, obstest.Call{Path: "/flaky", Tenant: "t1", Key: "k-flaky", Body: create})
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	s.WaitServed(t, 11)

	wantRequests := map[[2]string]float64{
		{obstest.RouteOrders, "committed"}:   2,
		{obstest.RouteOrders, "replayed"}:    3,
		{obstest.RouteOrders, "conflict"}:    1,
		{obstest.RouteOrders, "in_progress"}: 1,
		{obstest.RouteOrders, "rejected"}:    1,
		{obstest.RouteOrders, "invalid"}:     1,
		{obstest.RouteFlaky, "released"}:     2,
	}
	for k, want := range wantRequests {
		require.Equal(t, want, value(t, reg, "idempotency_requests_total", "route", k[0], "outcome", k[1]), "requests %v", k)
		require.Equal(t, uint64(want), samples(t, reg, "idempotency_request_duration_seconds", "route", k[0], "outcome", k[1]),
			"request duration samples %v", k)
	}
	require.Equal(t, len(wantRequests), testutil.CollectAndCount(reg, "idempotency_requests_total"),
		"no other (route, outcome) series")
	require.Equal(t, 11.0, sum(t, reg, "idempotency_requests_total"), "one final outcome per request")
	require.Equal(t, len(wantRequests), testutil.CollectAndCount(reg, "idempotency_request_duration_seconds"))

	// Steps: every execution claimed its key first; nothing was taken over.
	require.Equal(t, 3.0, value(t, reg, "idempotency_events_total", "route", obstest.RouteOrders, "event", "claimed"))
	require.Equal(t, 2.0, value(t, reg, "idempotency_events_total", "route", obstest.RouteFlaky, "event", "claimed"))
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idempotency_events_total"))

	require.Equal(t, 2.0, value(t, reg, "idempotency_replays_total", "route", obstest.RouteOrders, "record_status", "DONE"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_replays_total", "route", obstest.RouteOrders, "record_status", "FAILED"))
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idempotency_replays_total"))
	require.Equal(t, 3.0, sum(t, reg, "idempotency_replay_sources_total"), "every replay has one source")

	// Stages: 8 keyed requests on /orders reached the claim, 3 executed, 3
	// replayed; the two /flaky requests claimed and executed.
	wantStages := map[[2]string]uint64{
		{obstest.RouteOrders, "claim"}: 8, {obstest.RouteOrders, "execute"}: 3, {obstest.RouteOrders, "finalize"}: 3, {obstest.RouteOrders, "replay"}: 3,
		{obstest.RouteFlaky, "claim"}: 2, {obstest.RouteFlaky, "execute"}: 2, {obstest.RouteFlaky, "finalize"}: 2,
	}
	for k, want := range wantStages {
		require.Equal(t, want, samples(t, reg, "idempotency_stage_duration_seconds", "route", k[0], "stage", k[1]), "stage %v", k)
	}
	require.Equal(t, len(wantStages), testutil.CollectAndCount(reg, "idempotency_stage_duration_seconds"),
		"no stage series for the request stage")

	require.Equal(t, 0.0, value(t, reg, "idempotency_claims_in_flight", "route", obstest.RouteOrders))
	require.Equal(t, 0.0, value(t, reg, "idempotency_claims_in_flight", "route", obstest.RouteFlaky))

	var orders int
	require.NoError(t, s.DB.QueryRow("SELECT COUNT(*) FROM purchase_order").Scan(&orders))
	require.Equal(t, 2, orders, "the counted commits are the orders in the database")
}

func TestObserver_TakeOverOfAnExpiredLease_CountsTakenOverNotClaimed(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	s := obstest.NewService(t, obs, obstest.Options{})
	body := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 1})
	s.Abandon(t, "t1", "k-crashed", obstest.Fingerprint(t, body))

	status, _ := s.Do(t, obstest.Call{Tenant: "t1", Key: "k-crashed", Body: body})
	require.Equal(t, http.StatusCreated, status)
	s.WaitServed(t, 1)

	require.Equal(t, 1.0, value(t, reg, "idempotency_events_total", "route", obstest.RouteOrders, "event", "taken_over"))
	require.Equal(t, 0.0, value(t, reg, "idempotency_events_total", "route", obstest.RouteOrders, "event", "claimed"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_requests_total", "route", obstest.RouteOrders, "outcome", "committed"))
	require.Equal(t, 1.0, sum(t, reg, "idempotency_requests_total"))
	require.Equal(t, uint64(1), samples(t, reg, "idempotency_stage_duration_seconds", "route", obstest.RouteOrders, "stage", "claim"))
	require.Equal(t, 0.0, value(t, reg, "idempotency_claims_in_flight", "route", obstest.RouteOrders))
}

func TestObserver_StoreFailureAtClaim_CountsStoreErrorAsTheFinalOutcome(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	s := obstest.NewService(t, obs, obstest.Options{})
	_, err := s.DB.Exec("DROP TABLE idempotency_record") // the store now fails every statement
	require.NoError(t, err)

	status, _ := s.Do(t, obstest.Call{Tenant: "t1", Key: "k-1", Body: obstest.MustJSON(t, obstest.OrderRequest{SKU: 1, Quantity: 1})})
	require.Equal(t, http.StatusServiceUnavailable, status)
	s.WaitServed(t, 1)

	require.Equal(t, 1.0, value(t, reg, "idempotency_requests_total", "route", obstest.RouteOrders, "outcome", "store_error"))
	require.Equal(t, 1.0, sum(t, reg, "idempotency_requests_total"))
	require.Equal(t, 0.0, sum(t, reg, "idempotency_events_total"), "a deciding store error is not also a step")
	require.Equal(t, uint64(1), samples(t, reg, "idempotency_stage_duration_seconds", "route", obstest.RouteOrders, "stage", "claim"))
	require.Equal(t, uint64(0), samples(t, reg, "idempotency_stage_duration_seconds", "route", obstest.RouteOrders, "stage", "execute"))
}

func TestObserver_ReconcilerAndPurge_AddTheirRecordCounts(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	s := obstest.NewService(t, obs, obstest.Options{})
	ctx := context.Background()
	for _, key := range []string{"found-1", "found-2", "lost-1"} {
		s.Abandon(t, "t1", key, "fp")
	}
	r := &idempotency.Reconciler{Store: s.Store, Observer: obs,
		Recover: func(_ context.Context, rec *idempotency.Record) (*idempotency.Snapshot, bool, error) {
			if strings.HasPrefix(rec.Key, "found-") {
				return &idempotency.Snapshot{StatusCode: http.StatusCreated, Body: []byte(`{}`)}, true, nil
			}
			return nil, false, nil
		}}
	recovered, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int{2, 1}, [2]int{recovered, reclaimed})

	// Two final records whose retention has passed, one that has not.
	for key, retention := range map[string]time.Duration{"old-1": time.Microsecond, "old-2": time.Microsecond, "new": time.Hour} {
		lease, err := s.Store.Claim(ctx, idempotency.Claim{Scope: "t2", Key: key, Fingerprint: "fp", Owner: "o",
			Lease: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		_, err = s.Store.Finish(ctx, lease, idempotency.StatusDone, &idempotency.Snapshot{StatusCode: 201}, retention)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		rec, err := s.Store.Lookup(ctx, "t2", "old-2")
		return err == nil && rec.Expired
	}, 5*time.Second, time.Millisecond)
	purged, err := idempotency.Purge(ctx, s.Store, 1, obs)
	require.NoError(t, err)
	require.Equal(t, int64(2), purged)

	require.Equal(t, 2.0, value(t, reg, "idempotency_reconciled_total", "result", "recovered"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_reconciled_total", "result", "reclaimed"))
	require.Equal(t, 2.0, value(t, reg, "idempotency_purged_records_total"))
	require.Equal(t, 0.0, sum(t, reg, "idempotency_requests_total"), "background work is not a request")
}

func TestObserver_StepStoreErrorAndLeaseLost_AreEvents_TheirFinalFormsAreOutcomes(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	ctx := context.Background()
	boom := errors.New("connection reset")

	// A rejection that could not be stored: a store_error step, then the
	// final outcome.
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeClaimed})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeStoreError, Err: boom})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeRejected, Status: 422, Duration: time.Millisecond, Final: true})
	// A lost lease answered from the new owner's record.
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeTakenOver})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeLeaseLost, Err: boom})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeReplayed, Status: 201,
		Replayed: idempotency.StatusDone, Duration: 2 * time.Second, Final: true})
	// A store failure that decides the request, and an unknown commit.
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeStoreError, Status: 503, Err: boom, Duration: time.Millisecond, Final: true})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeUnknown, Status: 500, Err: boom, Duration: time.Millisecond, Final: true})

	for event, want := range map[string]float64{"claimed": 1, "taken_over": 1, "store_error": 1, "lease_lost": 1} {
		require.Equal(t, want, value(t, reg, "idempotency_events_total", "route", "r", "event", event), event)
	}
	require.Equal(t, 4.0, sum(t, reg, "idempotency_events_total"))
	for outcome, want := range map[string]float64{"rejected": 1, "replayed": 1, "store_error": 1, "commit_unknown": 1} {
		require.Equal(t, want, value(t, reg, "idempotency_requests_total", "route", "r", "outcome", outcome), outcome)
	}
	require.Equal(t, 4.0, sum(t, reg, "idempotency_requests_total"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_replays_total", "route", "r", "record_status", "DONE"))

	// The duration lands in its bucket: 2s is above le=1 and within le=2.5.
	h := find(t, reg, "idempotency_request_duration_seconds", "route", "r", "outcome", "replayed").GetHistogram()
	require.Equal(t, 2.0, h.GetSampleSum())
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 1 {
			require.Zero(t, b.GetCumulativeCount())
		}
		if b.GetUpperBound() == 2.5 {
			require.Equal(t, uint64(1), b.GetCumulativeCount())
		}
	}
}

func TestObserver_ExecuteStageEndedTwice_DecrementsInFlightOnce(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	_, end := obs.StartStage(context.Background(), idempotency.StageExecute, "r")
	require.Equal(t, 1.0, value(t, reg, "idempotency_claims_in_flight", "route", "r"))
	end(idempotency.StageEnd{})
	end(idempotency.StageEnd{})
	require.Equal(t, 0.0, value(t, reg, "idempotency_claims_in_flight", "route", "r"))
	require.Equal(t, uint64(1), samples(t, reg, "idempotency_stage_duration_seconds", "route", "r", "stage", "execute"))
}

// driveAll makes every metric of obs have at least one series.
func driveAll(obs *metrics.Observer, keyHash string) {
	ctx := context.Background()
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeClaimed, KeyHash: keyHash})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeReplayed, Status: 201,
		Replayed: idempotency.StatusDone, Duration: time.Millisecond, KeyHash: keyHash, Final: true})
	obs.Observe(ctx, idempotency.Event{Outcome: idempotency.OutcomeRecovered, Count: 1, KeyHash: keyHash})
	obs.Observe(ctx, idempotency.Event{Outcome: idempotency.OutcomePurged, Count: 3})
	for _, s := range []idempotency.Stage{idempotency.StageRequest, idempotency.StageClaim, idempotency.StageExecute} {
		_, end := obs.StartStage(ctx, s, "r")
		end(idempotency.StageEnd{KeyHash: keyHash})
	}
}

func TestNew_EveryMetricHasHelp_AndOnlyBoundedLabels_NeverTheKeyHash(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t, metrics.WithSharedCache("redis", newFakeSharedCache()))
	keyHash := idempotency.KeyHash("tenant", "secret-key")
	driveAll(obs, keyHash)

	allowed := map[string]bool{"route": true, "outcome": true, "event": true, "record_status": true, "stage": true, "result": true, "cache": true, "source": true}
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
		require.True(t, strings.HasPrefix(f.GetName(), "idempotency_"), f.GetName())
		require.NotEmpty(t, f.GetHelp(), "%s has no help", f.GetName())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				require.True(t, allowed[l.GetName()], "%s has label %s", f.GetName(), l.GetName())
				require.NotContains(t, l.GetValue(), keyHash)
				require.NotContains(t, l.GetValue(), "secret-key")
			}
		}
	}
	require.ElementsMatch(t, []string{
		"idempotency_requests_total", "idempotency_events_total", "idempotency_replays_total",
		"idempotency_replay_sources_total", "idempotency_request_duration_seconds", "idempotency_stage_duration_seconds",
		"idempotency_claims_in_flight", "idempotency_reconciled_total", "idempotency_purged_records_total",
		"idempotency_shared_cache_up", "idempotency_shared_cache_fail_opens_total",
		"idempotency_shared_cache_skipped_total", "idempotency_shared_cache_downs_total",
	}, names)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "promlint")
}

func TestNew_WithRoutes_PreinitialisesEverySeriesAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newObserver(t, metrics.WithRoutes("a", "b"))

	require.Equal(t, 2*10, testutil.CollectAndCount(reg, "idempotency_requests_total"), "10 final outcomes per route")
	require.Equal(t, 2*4, testutil.CollectAndCount(reg, "idempotency_events_total"))
	require.Equal(t, 2*2, testutil.CollectAndCount(reg, "idempotency_replays_total"))
	require.Equal(t, 2*3, testutil.CollectAndCount(reg, "idempotency_replay_sources_total"), "cache, shared and store per route")
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idempotency_claims_in_flight"))
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idempotency_reconciled_total"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "idempotency_purged_records_total"))
	require.Equal(t, 0.0, sum(t, reg, "idempotency_requests_total"))
	require.NotNil(t, find(t, reg, "idempotency_requests_total", "route", "a", "outcome", "commit_unknown"))
}

func TestNew_SameRegistryTwice_SharesTheMetrics(t *testing.T) {
	t.Parallel()
	first, reg := newObserver(t)
	second, err := metrics.New(reg)
	require.NoError(t, err)

	ev := idempotency.Event{Route: "r", Outcome: idempotency.OutcomeCommitted, Duration: time.Millisecond, Final: true}
	first.Observe(context.Background(), ev)
	second.Observe(context.Background(), ev)
	require.Equal(t, 2.0, value(t, reg, "idempotency_requests_total", "route", "r", "outcome", "committed"))
}

func TestNew_NameTakenByAnotherCollector_ReturnsError(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "idempotency_requests_total", Help: "squatter"}))
	_, err := metrics.New(reg)
	require.Error(t, err)
}

func TestNew_NilRegisterer_ReturnsError(t *testing.T) {
	t.Parallel()
	_, err := metrics.New(nil)
	require.Error(t, err)
	require.Panics(t, func() { metrics.MustNew(nil) })
}

// Each replay is counted once by where its snapshot came from (Event.From),
// so that an operator sees how many replays Redis answered without the
// database; the sources sum to the replayed outcome.
func TestObserver_CountsReplaysBySource(t *testing.T) {
	t.Parallel()
	obs, reg := newObserver(t)
	replay := func(from idempotency.ReplaySource) idempotency.Event {
		return idempotency.Event{Route: "r", Outcome: idempotency.OutcomeReplayed, Final: true, Status: 201,
			Replayed: idempotency.StatusDone, From: from}
	}
	for _, from := range []idempotency.ReplaySource{
		idempotency.ReplayFromCache, idempotency.ReplayFromShared, idempotency.ReplayFromShared,
		idempotency.ReplayFromStore, idempotency.ReplayFromStore, idempotency.ReplayFromStore,
	} {
		obs.Observe(context.Background(), replay(from))
	}
	for source, want := range map[string]float64{"cache": 1, "shared": 2, "store": 3} {
		require.Equal(t, want, value(t, reg, "idempotency_replay_sources_total", "route", "r", "source", source), "replays from %s", source)
	}
	require.Equal(t, value(t, reg, "idempotency_requests_total", "route", "r", "outcome", "replayed"),
		sum(t, reg, "idempotency_replay_sources_total"), "sources sum to the replayed outcome")
}
