// Package metrics exports the idempotency middleware's observations as
// Prometheus metrics.
//
// An *Observer implements both idempotency.Observer and
// idempotency.StageObserver. Create one per registry and hand it to every
// Middleware (one per route), the Reconciler and Purge:
//
//	obs, err := metrics.New(prometheus.DefaultRegisterer, metrics.WithRoutes("create_order"))
//	if err != nil {
//		return err
//	}
//	mw, err := idempotency.New(store, &idempotency.Config{Route: "create_order", Observer: obs})
//	if err != nil {
//		return err
//	}
//	rec := &idempotency.Reconciler{Store: store, Recover: recoverOrder, Observer: obs}
//
// Every metric is in the namespace "idempotency" and is labelled with bounded
// values only: the route (Config.Route), the outcome, event, stage, record
// status or reconcile result. The key, its hash and the scope are never
// labels.
//
// The metrics, and exactly what they count:
//
//   - idempotency_requests_total{route,outcome}: requests by their final
//     outcome. Each request through the middleware adds exactly one:
//     committed, rejected, released, replayed, conflict, in_progress,
//     invalid, unprotected, store_error or commit_unknown.
//   - idempotency_events_total{route,event}: steps taken on the way to the
//     final outcome: claimed (a new key was claimed), taken_over (an expired
//     lease or record was taken over), lease_lost (this attempt lost its lease
//     and rolled back) and store_error (a store call failed but the request
//     was still answered with another final outcome). A request adds zero or
//     more; a store failure that decides the request is counted in
//     idempotency_requests_total{outcome="store_error"} instead.
//   - idempotency_replays_total{route,record_status}: replayed answers by the
//     status of the record replayed, DONE or FAILED. It sums to
//     idempotency_requests_total{outcome="replayed"}.
//   - idempotency_replay_sources_total{route,source}: replayed answers by
//     where the snapshot came from (Event.From): cache (this process's
//     replay cache), shared (Config.SharedCache, Redis: the database was
//     not asked) or store (the record, read from the database). It sums to
//     idempotency_requests_total{outcome="replayed"} too.
//   - idempotency_request_duration_seconds{route,outcome}: histogram of the
//     time from a request's arrival at the middleware to its final outcome.
//   - idempotency_stage_duration_seconds{route,stage}: histogram of the
//     duration of each protocol stage: claim (the claim, look-up and takeover
//     statements; in ModeSinglePhase the look-up), execute (BEGIN and the
//     handler inside its transaction), finalize (storing the outcome, COMMIT
//     or release, and writing the answer) and replay (writing a stored
//     answer). A replay served from the in-process replay cache has no claim
//     stage.
//   - idempotency_claims_in_flight{route}: handlers executing right now: the
//     number of execute stages started and not yet ended. In ModeClaimFirst
//     each holds a claim (a PROCESSING record under its lease); in
//     ModeSinglePhase no record exists until the commit.
//   - idempotency_reconciled_total{result}: abandoned PROCESSING records the
//     Reconciler settled, by result: recovered (the effect existed; the
//     snapshot was backfilled) or reclaimed (no effect; the key was released).
//   - idempotency_purged_records_total: final records deleted by Purge after
//     their retention.
//
// With WithSharedCache, the state of Config.SharedCache (Redis, package
// idemredis), read from its Health at every scrape and labelled with the
// name given (cache):
//
//   - idempotency_shared_cache_up{cache}: 1 while calls go to the shared
//     cache, 0 while it is down and calls skip it (requests then go to the
//     database, never to an error).
//   - idempotency_shared_cache_fail_opens_total{cache}: calls that failed or
//     timed out: each was a miss, and the request went on to the database.
//   - idempotency_shared_cache_skipped_total{cache}: calls not made because
//     the shared cache was down.
//   - idempotency_shared_cache_downs_total{cache}: times the shared cache was
//     marked down (each is logged once; so is each return).
//
// A *PaymentCollector (NewPaymentCollector), given as payment.Config.Observe,
// counts payment provider callbacks: idempotency_payment_callbacks_total
// {provider,result} and idempotency_payment_anomalies_total{provider,reason}
// (see PaymentCollector).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderguard/idempotency"
)

// Namespace prefixes every metric name.
const Namespace = "idempotency"

// DefaultRequestBuckets are the buckets of
// idempotency_request_duration_seconds, in seconds: from a cached replay
// (sub-millisecond) to a handler that runs close to the default 30s lease.
var DefaultRequestBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// DefaultStageBuckets are the buckets of idempotency_stage_duration_seconds,
// in seconds: a store statement on a healthy database takes a millisecond or
// two, so the low end is finer.
var DefaultStageBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// finalOutcomes are the final outcomes of a request, pre-initialised for
// every route given to WithRoutes.
var finalOutcomes = []idempotency.Outcome{
	idempotency.OutcomeCommitted, idempotency.OutcomeRejected, idempotency.OutcomeReleased,
	idempotency.OutcomeReplayed, idempotency.OutcomeConflict, idempotency.OutcomeInProgress,
	idempotency.OutcomeInvalid, idempotency.OutcomeUnprotected, idempotency.OutcomeStoreError,
	idempotency.OutcomeUnknown,
}

// stepOutcomes are the step outcomes counted in idempotency_events_total.
var stepOutcomes = []idempotency.Outcome{
	idempotency.OutcomeClaimed, idempotency.OutcomeTakenOver,
	idempotency.OutcomeLeaseLost, idempotency.OutcomeStoreError,
}

// replayStatuses are the record statuses a replay can find.
var replayStatuses = []idempotency.Status{idempotency.StatusDone, idempotency.StatusFailed}

// replaySources are where a replayed snapshot can come from.
var replaySources = []idempotency.ReplaySource{idempotency.ReplayFromCache, idempotency.ReplayFromShared, idempotency.ReplayFromStore}

// Option configures New.
type Option func(*options)

type options struct {
	requestBuckets []float64
	stageBuckets   []float64
	routes         []string
	constLabels    prometheus.Labels
	sharedCaches   []sharedCache
	providers      []string // NewPaymentCollector's
}

type sharedCache struct {
	name     string
	reporter idempotency.SharedCacheHealthReporter
}

// WithRequestBuckets replaces DefaultRequestBuckets.
func WithRequestBuckets(buckets ...float64) Option {
	return func(o *options) { o.requestBuckets = append([]float64(nil), buckets...) }
}

// WithStageBuckets replaces DefaultStageBuckets.
func WithStageBuckets(buckets ...float64) Option {
	return func(o *options) { o.stageBuckets = append([]float64(nil), buckets...) }
}

// WithRoutes pre-initialises the counters and the in-flight gauge at 0 for
// each route and every outcome, event and record status, so that increase()
// and rate() see the first occurrence of a rare outcome (a store error, an
// unknown commit) instead of a series that appears already at 1. Pass the
// Config.Route of every Middleware that uses this Observer.
func WithRoutes(routes ...string) Option {
	return func(o *options) { o.routes = append(o.routes, routes...) }
}

// WithConstLabels adds constant labels to every metric, for example to tell
// two services apart that share one registry.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(o *options) { o.constLabels = labels }
}

// WithSharedCache exports the health of a Config.SharedCache (an
// *idemredis.Cache) as the idempotency_shared_cache_* metrics, labelled
// cache=name, read from c.Health() at every scrape. Give each shared cache
// of a process its own name; New called again with the same registry and
// name keeps the cache first registered under it.
func WithSharedCache(name string, c idempotency.SharedCacheHealthReporter) Option {
	return func(o *options) { o.sharedCaches = append(o.sharedCaches, sharedCache{name, c}) }
}

// Observer records the middleware's observations as Prometheus metrics. It
// implements idempotency.Observer and idempotency.StageObserver and is safe
// for concurrent use. Create it with New.
type Observer struct {
	requests        *prometheus.CounterVec
	events          *prometheus.CounterVec
	replays         *prometheus.CounterVec
	replaySources   *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	stageDuration   *prometheus.HistogramVec
	inFlight        *prometheus.GaugeVec
	reconciled      *prometheus.CounterVec
	purged          prometheus.Counter
}

var (
	_ idempotency.Observer      = (*Observer)(nil)
	_ idempotency.StageObserver = (*Observer)(nil)
)

// New creates the metrics and registers them with reg. Calling New again
// with the same registry (and the same options) returns an Observer over the
// metrics already registered, so each Middleware may create its own; any
// other registration conflict is an error.
func New(reg prometheus.Registerer, opts ...Option) (*Observer, error) {
	if reg == nil {
		return nil, errors.New("metrics: New needs a prometheus.Registerer (prometheus.DefaultRegisterer for the global registry)")
	}
	o := options{requestBuckets: DefaultRequestBuckets, stageBuckets: DefaultStageBuckets}
	for _, opt := range opts {
		opt(&o)
	}
	for _, sc := range o.sharedCaches { // before anything is registered
		if sc.name == "" || sc.reporter == nil {
			return nil, errors.New("metrics: WithSharedCache needs a name and a shared cache")
		}
	}
	obs := &Observer{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "requests_total", ConstLabels: o.constLabels,
			Help: "Requests through the idempotency middleware by final outcome (committed, rejected, released, replayed, conflict, in_progress, invalid, unprotected, store_error, commit_unknown); exactly one per request.",
		}, []string{"route", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "events_total", ConstLabels: o.constLabels,
			Help: "Protocol steps on the way to a request's final outcome: claimed (new key claimed), taken_over (expired lease or record taken over), lease_lost (attempt lost its lease and rolled back), store_error (a store call failed but the request was answered with another outcome).",
		}, []string{"route", "event"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "replays_total", ConstLabels: o.constLabels,
			Help: "Stored answers replayed, by the status of the replayed record (DONE or FAILED).",
		}, []string{"route", "record_status"}),
		replaySources: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "replay_sources_total", ConstLabels: o.constLabels,
			Help: "Stored answers replayed, by where the snapshot came from: cache (this process's replay cache), shared (the shared cache, Redis; the database was not asked) or store (read from the database).",
		}, []string{"route", "source"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "request_duration_seconds", ConstLabels: o.constLabels,
			Help:    "Time from a request's arrival at the idempotency middleware to its final outcome, by outcome.",
			Buckets: o.requestBuckets,
		}, []string{"route", "outcome"}),
		stageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "stage_duration_seconds", ConstLabels: o.constLabels,
			Help:    "Duration of one protocol stage: claim (claim, look-up and takeover statements), execute (BEGIN and the handler in its transaction), finalize (store outcome, commit or release, answer), replay (write a stored answer).",
			Buckets: o.stageBuckets,
		}, []string{"route", "stage"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "claims_in_flight", ConstLabels: o.constLabels,
			Help: "Handlers executing right now behind the idempotency middleware (execute stages started and not yet ended); in claim-first mode each holds a claim.",
		}, []string{"route"}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reconciled_total", ConstLabels: o.constLabels,
			Help: "Abandoned PROCESSING records settled by the reconciler: recovered (effect found, snapshot backfilled) or reclaimed (no effect, key released).",
		}, []string{"result"}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "purged_records_total", ConstLabels: o.constLabels,
			Help: "Final idempotency records deleted by Purge after their retention.",
		}),
	}

	var err error
	if obs.requests, err = register(reg, obs.requests); err != nil {
		return nil, err
	}
	if obs.events, err = register(reg, obs.events); err != nil {
		return nil, err
	}
	if obs.replays, err = register(reg, obs.replays); err != nil {
		return nil, err
	}
	if obs.replaySources, err = register(reg, obs.replaySources); err != nil {
		return nil, err
	}
	if obs.requestDuration, err = register(reg, obs.requestDuration); err != nil {
		return nil, err
	}
	if obs.stageDuration, err = register(reg, obs.stageDuration); err != nil {
		return nil, err
	}
	if obs.inFlight, err = register(reg, obs.inFlight); err != nil {
		return nil, err
	}
	if obs.reconciled, err = register(reg, obs.reconciled); err != nil {
		return nil, err
	}
	if obs.purged, err = register(reg, obs.purged); err != nil {
		return nil, err
	}

	for _, sc := range o.sharedCaches {
		if err := registerSharedCache(reg, sc, o.constLabels); err != nil {
			return nil, err
		}
	}

	for _, r := range []idempotency.Outcome{idempotency.OutcomeRecovered, idempotency.OutcomeReclaimed} {
		obs.reconciled.WithLabelValues(string(r))
	}
	for _, route := range o.routes {
		for _, oc := range finalOutcomes {
			obs.requests.WithLabelValues(route, string(oc))
		}
		for _, ev := range stepOutcomes {
			obs.events.WithLabelValues(route, string(ev))
		}
		for _, st := range replayStatuses {
			obs.replays.WithLabelValues(route, string(st))
		}
		for _, src := range replaySources {
			obs.replaySources.WithLabelValues(route, string(src))
		}
		obs.inFlight.WithLabelValues(route)
	}
	return obs, nil
}

// MustNew is New that panics on error, for package-level initialisation.
func MustNew(reg prometheus.Registerer, opts ...Option) *Observer {
	obs, err := New(reg, opts...)
	if err != nil {
		panic(err)
	}
	return obs
}

// register registers c, or returns the collector of the same type already
// registered under the same descriptors.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("metrics: register: %w", err)
}

// registerSharedCache registers the idempotency_shared_cache_* metrics of
// one shared cache: functions of its Health, so that a scrape sees its
// state as it is, and the shared cache needs no Prometheus of its own.
func registerSharedCache(reg prometheus.Registerer, sc sharedCache, constLabels prometheus.Labels) error {
	labels := prometheus.Labels{"cache": sc.name}
	for k, v := range constLabels {
		labels[k] = v
	}
	health := sc.reporter.Health
	if _, err := register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "shared_cache_up", ConstLabels: labels,
		Help: "1 while calls go to the shared cache (Redis), 0 while it is down and requests skip it for the database.",
	}, func() float64 {
		if health().Up {
			return 1
		}
		return 0
	})); err != nil {
		return err
	}
	for _, c := range []struct {
		name, help string
		value      func(idempotency.SharedCacheHealth) uint64
	}{
		{"shared_cache_fail_opens_total", "Shared cache (Redis) calls that failed or timed out; each was a miss and the request went on to the database.",
			func(h idempotency.SharedCacheHealth) uint64 { return h.FailOpens }},
		{"shared_cache_skipped_total", "Shared cache (Redis) calls not made because it was down; the request went on to the database.",
			func(h idempotency.SharedCacheHealth) uint64 { return h.Skipped }},
		{"shared_cache_downs_total", "Times the shared cache (Redis) was marked down.",
			func(h idempotency.SharedCacheHealth) uint64 { return h.Downs }},
	} {
		if _, err := register(reg, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: Namespace, Name: c.name, ConstLabels: labels, Help: c.help,
		}, func() float64 { return float64(c.value(health())) })); err != nil {
			return err
		}
	}
	return nil
}

// Observe implements idempotency.Observer.
//
// A request's final event (the one carrying its Duration) adds to
// idempotency_requests_total and idempotency_request_duration_seconds, and a
// replay also to idempotency_replays_total and
// idempotency_replay_sources_total. Step events (claimed, taken_over,
// and lease_lost or store_error without a Duration) add to
// idempotency_events_total. Reconciler events add their Count (1 if unset) to
// idempotency_reconciled_total; Purge's adds its Count to
// idempotency_purged_records_total.
func (o *Observer) Observe(_ context.Context, e idempotency.Event) {
	switch {
	case e.Outcome == idempotency.OutcomeRecovered || e.Outcome == idempotency.OutcomeReclaimed:
		n := e.Count
		if n <= 0 {
			n = 1
		}
		o.reconciled.WithLabelValues(string(e.Outcome)).Add(float64(n))
	case e.Outcome == idempotency.OutcomePurged:
		if e.Count > 0 {
			o.purged.Add(float64(e.Count))
		}
	case isStep(e):
		o.events.WithLabelValues(e.Route, string(e.Outcome)).Inc()
	default:
		o.requests.WithLabelValues(e.Route, string(e.Outcome)).Inc()
		o.requestDuration.WithLabelValues(e.Route, string(e.Outcome)).Observe(e.Duration.Seconds())
		if e.Outcome == idempotency.OutcomeReplayed {
			status := string(e.Replayed)
			if status == "" {
				status = "unknown"
			}
			o.replays.WithLabelValues(e.Route, status).Inc()
			source := string(e.From)
			if source == "" {
				source = "unknown"
			}
			o.replaySources.WithLabelValues(e.Route, source).Inc()
		}
	}
}

// isStep tells a request's step events from its one final event.
func isStep(e idempotency.Event) bool {
	return !e.Final
}

// StartStage implements idempotency.StageObserver. Every stage but
// StageRequest (whose duration is idempotency_request_duration_seconds, by
// outcome) is timed into idempotency_stage_duration_seconds; StageExecute
// also holds idempotency_claims_in_flight up by one until it ends. The
// context is returned unchanged.
func (o *Observer) StartStage(ctx context.Context, s idempotency.Stage, route string) (context.Context, func(idempotency.StageEnd)) {
	if s == idempotency.StageRequest {
		return ctx, func(idempotency.StageEnd) {}
	}
	hist := o.stageDuration.WithLabelValues(route, string(s))
	var gauge prometheus.Gauge
	if s == idempotency.StageExecute {
		gauge = o.inFlight.WithLabelValues(route)
		gauge.Inc()
	}
	start := time.Now()
	var ended atomic.Bool
	return ctx, func(idempotency.StageEnd) {
		if !ended.CompareAndSwap(false, true) {
			return // ended twice: count it once
		}
		hist.Observe(time.Since(start).Seconds())
		if gauge != nil {
			gauge.Dec()
		}
	}
}
