package orderservice

import (
	"context"

	"github.com/orderguard/idempotency/payment"
)

// RecordPayloadMismatch records ev, a verified payment event whose id the
// protocol refused as reused with another payload, as a payload-mismatch
// anomaly on the service's database, never applying it
// (payment.RecordPayloadMismatch): what every path of the PaymentEvents
// action does with such an event, the webhook (PaymentWebhook) and a
// queue consumer of the events alike, so that it is recorded once and
// acknowledged on either.
func (s *Service) RecordPayloadMismatch(ctx context.Context, ev payment.Event) error {
	return payment.RecordPayloadMismatch(ctx, s.db, s.sql.orders, ev)
}
