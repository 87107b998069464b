package idempotency

import (
	"context"
	"database/sql"
	"strings"
)

// RecordPayloadMismatch records, in tx, that ev arrived under an event id
// whose first delivery had another payload (the protocol refused it as the
// key reused with another fingerprint): an anomaly of reason
// AnomalyPayloadMismatch, nothing else. It never applies ev, whatever
// became of the first delivery (still in progress, rolled back, or an
// event the store could not hold), so that a payload that is not the
// event's can never take effect through this path. Recording the same
// mismatch again is a no-op.
func (s Orders) RecordPayloadMismatch(ctx context.Context, tx *sql.Tx, ev PaymentEvent) error {
	ev.Currency = strings.ToUpper(ev.Currency)
	return s.insertAnomaly(ctx, tx, ev, ev.OrderNo, AnomalyPayloadMismatch)
}
