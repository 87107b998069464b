package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/orderguard/idempotency"
)

// noServerTakesWrites reports a connection attempt that reached every host
// the URL lists and found none that takes writes: target_session_attrs
// read-write refused each as read-only, or primary refused each as a
// standby. During a failover or a switchover every node of a cluster is a
// standby for a moment (the old primary demoted or restarted as a replica,
// the new one not promoted yet), and the next attempt may find the new
// primary.
func noServerTakesWrites(err error) bool {
	return errors.Is(err, pgconn.ErrReadOnlyConnection) || errors.Is(err, pgconn.ErrStandbyConnection)
}

// classifyConnect marks a failed connection attempt that
// idempotency.IsTransient cannot classify by itself: pgx reports a host
// that does not take writes with its own sentinel errors, which the root
// module, free of pgx, does not know. Such a failure wraps
// idempotency.ErrTransient, so that a handler that meets it answers 503
// with Retry-After, as it does when the primary is unreachable.
func classifyConnect(err error) error {
	if noServerTakesWrites(err) && !idempotency.IsTransient(err) {
		return fmt.Errorf("%w (no server takes writes yet: %w)", err, idempotency.ErrTransient)
	}
	return err
}
