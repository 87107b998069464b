package metrics_test

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/metrics"
)

// fakeSharedCache reports whatever health the test sets, as an
// *idemredis.Cache reports its own.
type fakeSharedCache struct {
	mu sync.Mutex
	h  idempotency.SharedCacheHealth
}

func newFakeSharedCache() *fakeSharedCache {
	return &fakeSharedCache{h: idempotency.SharedCacheHealth{Up: true}}
}

func (f *fakeSharedCache) Health() idempotency.SharedCacheHealth {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.h
}

func (f *fakeSharedCache) set(change func(*idempotency.SharedCacheHealth)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.h)
}

func TestSharedCache_UpGaugeAndCountersFollowTheCachesHealthAtEveryScrape(t *testing.T) {
	t.Parallel()
	redis := newFakeSharedCache()
	_, reg := newObserver(t, metrics.WithSharedCache("redis", redis))
	up := func() float64 { return value(t, reg, "idempotency_shared_cache_up", "cache", "redis") }
	require.NotNil(t, find(t, reg, "idempotency_shared_cache_up", "cache", "redis"), "the gauge exists from New")
	require.Equal(t, 1.0, up())

	// Redis stops: calls fail open, it is marked down and calls skip it.
	redis.set(func(h *idempotency.SharedCacheHealth) { h.Up, h.FailOpens, h.Downs, h.Skipped = false, 3, 1, 40 })
	require.Equal(t, 0.0, up())
	require.Equal(t, 3.0, value(t, reg, "idempotency_shared_cache_fail_opens_total", "cache", "redis"))
	require.Equal(t, 40.0, value(t, reg, "idempotency_shared_cache_skipped_total", "cache", "redis"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_shared_cache_downs_total", "cache", "redis"))

	// A probe finds it back.
	redis.set(func(h *idempotency.SharedCacheHealth) { h.Up, h.Ups = true, 1 })
	require.Equal(t, 1.0, up())
	require.Equal(t, 1.0, value(t, reg, "idempotency_shared_cache_downs_total", "cache", "redis"))
}

func TestSharedCache_TwoCachesAreTwoSeries_TheSameNameTwiceKeepsTheFirst(t *testing.T) {
	t.Parallel()
	sessions, orders, impostor := newFakeSharedCache(), newFakeSharedCache(), newFakeSharedCache()
	orders.set(func(h *idempotency.SharedCacheHealth) { h.Up = false })
	impostor.set(func(h *idempotency.SharedCacheHealth) { h.Up = true })
	_, reg := newObserver(t, metrics.WithSharedCache("sessions", sessions), metrics.WithSharedCache("orders", orders))
	// Another Middleware's New on the same registry.
	_, err := metrics.New(reg, metrics.WithSharedCache("orders", impostor))
	require.NoError(t, err)

	require.Equal(t, 2, testutil.CollectAndCount(reg, "idempotency_shared_cache_up"))
	require.Equal(t, 1.0, value(t, reg, "idempotency_shared_cache_up", "cache", "sessions"))
	require.Equal(t, 0.0, value(t, reg, "idempotency_shared_cache_up", "cache", "orders"))
}

func TestSharedCache_WithoutWithSharedCache_NoSharedCacheMetrics(t *testing.T) {
	t.Parallel()
	_, reg := newObserver(t, metrics.WithRoutes("r"))
	require.Zero(t, testutil.CollectAndCount(reg, "idempotency_shared_cache_up"))
}

func TestSharedCache_ConstLabelsApplyToo(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	_, err := metrics.New(reg, metrics.WithConstLabels(prometheus.Labels{"service": "orders"}),
		metrics.WithSharedCache("redis", newFakeSharedCache()))
	require.NoError(t, err)
	require.Equal(t, 1.0, value(t, reg, "idempotency_shared_cache_up", "cache", "redis", "service", "orders"))
}

func TestSharedCache_WithoutANameOrACache_NewReturnsErrorAndRegistersNothing(t *testing.T) {
	t.Parallel()
	for _, opt := range []metrics.Option{
		metrics.WithSharedCache("", newFakeSharedCache()),
		metrics.WithSharedCache("redis", nil),
	} {
		reg := prometheus.NewRegistry()
		_, err := metrics.New(reg, opt)
		require.Error(t, err)
		// Nothing was registered: a collector of the same name as New's
		// first registers without a clash.
		require.NoError(t, reg.Register(prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "requests_total", Help: "probe",
		})), "a failed New left collectors registered")
	}
}
