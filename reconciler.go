package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// RecoverFunc decides the fate of a record whose attempt died: it checks
// whether the business effect exists outside the idempotency record (in the
// example, a purchase_order row with the record's scope and key). If it does,
// it returns found=true and the snapshot a retry should get; if not, found is
// false and the key is released so that a retry executes.
type RecoverFunc func(ctx context.Context, rec *Record) (snap *Snapshot, found bool, err error)

// Reconciler is the background task that settles PROCESSING records left by
// crashed attempts. It is safe to run on every instance at once: every
// change it makes is fenced by the lease version it read, so of several
// reconcilers (and a late original, and a retry taking the key over) exactly
// one acts on a record.
type Reconciler struct {
	// Store is the idempotency store (required).
	Store Store

	// Recover finds the effect of an abandoned attempt (required).
	Recover RecoverFunc

	// BatchSize is how many expired leases one pass reads. Defaults to 100.
	BatchSize int

	// Interval is the pause between passes. Defaults to 5s.
	Interval time.Duration

	// Retention applies to backfilled records. Defaults to 24h.
	Retention time.Duration

	// FailureBackoff is how long a record whose recovery failed is set
	// aside (its lease is extended, fenced) so that one broken record cannot
	// hold the head of the queue and starve the others. Defaults to 10 ×
	// Interval.
	FailureBackoff time.Duration

	// Observer receives OutcomeRecovered and OutcomeReclaimed. Defaults to
	// none.
	Observer Observer

	// Logger receives one line per settled record. Defaults to none.
	Logger *slog.Logger
}

// Run reconciles every Interval until ctx is done. Errors of one pass are
// logged and the next pass runs anyway.
func (r *Reconciler) Run(ctx context.Context) error {
	interval := r.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if _, _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.logger().Error("idempotency: reconcile pass failed", "err", err)
			if r.Observer != nil {
				r.Observer.Observe(ctx, Event{Route: "reconciler", Outcome: OutcomeStoreError, Err: err, Final: true})
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

// RunOnce settles one batch of expired leases and reports how many records
// it recovered (backfilled DONE) and reclaimed (released).
func (r *Reconciler) RunOnce(ctx context.Context) (recovered, reclaimed int, err error) {
	if r.Store == nil || r.Recover == nil {
		return 0, 0, errors.New("idempotency: Reconciler needs a Store and a Recover func")
	}
	batch := r.BatchSize
	if batch <= 0 {
		batch = 100
	}
	retention := r.Retention
	if retention <= 0 {
		retention = 24 * time.Hour
	}
	records, err := r.Store.ExpiredLeases(ctx, batch)
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	setAside := func(lease Lease, err error) {
		errs = append(errs, err)
		_, _ = r.Store.Extend(ctx, lease, r.failureBackoff()) // fenced; losing it is fine
	}
	for _, rec := range records {
		lease := Lease{Scope: rec.Scope, Key: rec.Key, Owner: rec.Owner, Version: rec.Version}
		snap, found, err := r.Recover(ctx, rec)
		if err == nil && found && snap == nil {
			err = errors.New("RecoverFunc found the effect but returned no snapshot")
		}
		if err != nil {
			setAside(lease, fmt.Errorf("recover %s: %w", KeyHash(rec.Scope, rec.Key), err))
			continue
		}
		outcome := OutcomeReclaimed
		if found {
			outcome = OutcomeRecovered
			_, err = r.Store.Finish(ctx, lease, StatusDone, snap, retention)
		} else {
			err = r.Store.Release(ctx, lease)
		}
		switch {
		case errors.Is(err, ErrLeaseLost):
			continue // someone else settled it first: that is fine
		case err != nil:
			setAside(lease, err)
			continue
		}
		if found {
			recovered++
		} else {
			reclaimed++
		}
		keyHash := KeyHash(rec.Scope, rec.Key)
		r.logger().Info("idempotency: reconciled abandoned attempt", "outcome", string(outcome),
			"key_hash", keyHash, "owner", rec.Owner, "lease_version", rec.Version)
		if r.Observer != nil {
			r.Observer.Observe(ctx, Event{Outcome: outcome, KeyHash: keyHash, Count: 1})
		}
	}
	return recovered, reclaimed, errors.Join(errs...)
}

func (r *Reconciler) failureBackoff() time.Duration {
	switch {
	case r.FailureBackoff > 0:
		return r.FailureBackoff
	case r.Interval > 0:
		return 10 * r.Interval
	default:
		return time.Minute
	}
}

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger == nil {
		return discardLogger
	}
	return r.Logger
}

// Purge deletes final records whose retention has passed, in batches of
// batchSize (each its own short statement, so no long lock is held), until
// none is left or ctx is done. PROCESSING records are never purged: their
// lease decides their fate. It returns how many records it deleted.
func Purge(ctx context.Context, store Store, batchSize int, obs Observer) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	var total int64
	for {
		n, err := store.Purge(ctx, batchSize)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(batchSize) {
			break
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
	if obs != nil && total > 0 {
		obs.Observe(ctx, Event{Outcome: OutcomePurged, Count: total})
	}
	return total, nil
}
