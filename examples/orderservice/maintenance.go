package orderservice

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/orderguard/idempotency"
)

// Maintenance is the background work each example program runs beside the
// service: the reconciler, which settles claims left by crashed attempts
// (the seed's background task: an order that exists gets its snapshot back,
// a key whose order does not exist is released), and the purge of expired
// records in bounded batches.
type Maintenance struct {
	Store idempotency.Store
	// Reconciler settles abandoned claims; nil turns it off. Its Retention
	// should be Config.Retention, as for a record any request finishes.
	Reconciler *idempotency.Reconciler
	// PurgeInterval is how often expired records are deleted; 0 turns the
	// purge off.
	PurgeInterval time.Duration
	Logger        *slog.Logger
	Observer      idempotency.Observer
}

// Reconciler returns the example's reconciler for svc: Recover finds the
// order of an abandoned claim. It is nil when interval is 0.
func Reconciler(store idempotency.Store, svc *Service, interval, retention time.Duration, log *slog.Logger, obs idempotency.Observer) *idempotency.Reconciler {
	if interval <= 0 {
		return nil
	}
	return &idempotency.Reconciler{
		Store: store, Recover: svc.Recover, Interval: interval, Retention: retention,
		Logger: log, Observer: obs,
	}
}

// Run runs the reconciler and the purge until ctx ends.
func (m Maintenance) Run(ctx context.Context) {
	log := m.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var wg sync.WaitGroup
	if m.Reconciler != nil {
		wg.Go(func() { _ = m.Reconciler.Run(ctx) })
	}
	if m.PurgeInterval > 0 {
		wg.Go(func() { m.purge(ctx, log) })
	}
	wg.Wait()
}

func (m Maintenance) purge(ctx context.Context, log *slog.Logger) {
	ticker := time.NewTicker(m.PurgeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		n, err := idempotency.Purge(ctx, m.Store, 1000, m.Observer)
		if err != nil && ctx.Err() == nil {
			log.Error("purge failed", "err", err)
		} else if n > 0 {
			log.Info("purged expired idempotency records", "count", n)
		}
	}
}
