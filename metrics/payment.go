package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/payment"
)

// PaymentResult is what became of one payment callback, the result label of
// idempotency_payment_callbacks_total.
type PaymentResult string

// Payment callback results.
const (
	// PaymentAcknowledged: verified and handled for the first time (applied,
	// kept pending, ignored or recorded as an anomaly), and acknowledged.
	PaymentAcknowledged PaymentResult = "acknowledged"
	// PaymentReplayed: a redelivery of an event handled before, answered
	// from its record without running anything.
	PaymentReplayed PaymentResult = "replayed"
	// PaymentRefusedSignature: the signature did not verify
	// (payment.ErrSignature). A steady rate is a wrong secret or a forger.
	PaymentRefusedSignature PaymentResult = "refused-signature"
	// PaymentRefusedStale: the timestamp is outside the tolerance
	// (payment.ErrStale): a replayed capture, or a skewed clock.
	PaymentRefusedStale PaymentResult = "refused-stale"
	// PaymentRefusedMalformed: signed but not parseable (payment.ErrMalformed).
	PaymentRefusedMalformed PaymentResult = "refused-malformed"
	// PaymentRefusedTooLarge: the body is over the limit (payment.ErrTooLarge).
	PaymentRefusedTooLarge PaymentResult = "refused-too-large"
	// PaymentRefusedUnavailable: verified but not handled now (the store
	// failed for a moment, or another delivery of the event is running);
	// the provider delivers it again.
	PaymentRefusedUnavailable PaymentResult = "refused-unavailable"
)

// paymentResults are every result, pre-initialised for every provider given
// to WithProviders.
var paymentResults = []PaymentResult{
	PaymentAcknowledged, PaymentReplayed, PaymentRefusedSignature, PaymentRefusedStale,
	PaymentRefusedMalformed, PaymentRefusedTooLarge, PaymentRefusedUnavailable,
}

// anomalyReasons are every reason a callback's outcome can carry,
// pre-initialised for every provider given to WithProviders.
var anomalyReasons = []idempotency.AnomalyReason{
	idempotency.AnomalyUnknownOrder, idempotency.AnomalyAmountMismatch, idempotency.AnomalyCurrencyMismatch,
	idempotency.AnomalyOrderMismatch, idempotency.AnomalyDoublePayment, idempotency.AnomalyRefundExceedsPayment,
	idempotency.AnomalyPayloadMismatch, idempotency.AnomalyRefundOwed, payment.AnomalyInvalidEvent,
}

// WithProviders pre-initialises the payment metrics at 0 for each provider
// (payment.Verifier's Provider(), "stripe", "alipay") and every result and
// anomaly reason, so that increase() sees a first forged signature or a
// first anomaly. NewPaymentCollector uses it; New ignores it.
func WithProviders(providers ...string) Option {
	return func(o *options) { o.providers = append(o.providers, providers...) }
}

// PaymentResultOf classifies an observation: acknowledged or replayed when
// it was not refused, otherwise by the sentinel its Refused error matches,
// and refused-unavailable for any other refusal.
func PaymentResultOf(obs payment.Observation) PaymentResult {
	switch err := obs.Refused; {
	case err == nil && obs.Replayed:
		return PaymentReplayed
	case err == nil:
		return PaymentAcknowledged
	case errors.Is(err, payment.ErrSignature):
		return PaymentRefusedSignature
	case errors.Is(err, payment.ErrStale):
		return PaymentRefusedStale
	case errors.Is(err, payment.ErrMalformed):
		return PaymentRefusedMalformed
	case errors.Is(err, payment.ErrTooLarge):
		return PaymentRefusedTooLarge
	default:
		return PaymentRefusedUnavailable
	}
}

// PaymentCollector records payment callbacks (package payment's Webhook)
// as Prometheus metrics. Hand its Observe to payment.Config.Observe. It is
// safe for concurrent use. Create it with NewPaymentCollector.
//
// The metrics, labelled with bounded values only (never an event, payment
// or order id):
//
//   - idempotency_payment_callbacks_total{provider,result}: callbacks by
//     what became of them, exactly one per callback: acknowledged,
//     replayed, refused-signature, refused-stale, refused-malformed,
//     refused-too-large or refused-unavailable (PaymentResult).
//   - idempotency_payment_anomalies_total{provider,reason}: callbacks whose
//     event the order store recorded as an anomaly, by reason
//     (idempotency.AnomalyReason, and payment.AnomalyInvalidEvent), counted
//     at the first delivery only: a replay repeats the first delivery's
//     outcome and adds nothing. refund-owed counts events that applied to a
//     canceled order; a cancel of a paid order owes a refund too, but is no
//     callback: idemctl anomalies (Orders.ListAnomalies) lists them all.
type PaymentCollector struct {
	callbacks *prometheus.CounterVec
	anomalies *prometheus.CounterVec
}

// NewPaymentCollector creates the payment metrics and registers them with
// reg. WithConstLabels and WithProviders apply; the other options are
// ignored. Calling it again with the same registry returns a collector over
// the metrics already registered, so each provider's Webhook may create its
// own; any other registration conflict is an error.
func NewPaymentCollector(reg prometheus.Registerer, opts ...Option) (*PaymentCollector, error) {
	if reg == nil {
		return nil, errors.New("metrics: NewPaymentCollector needs a prometheus.Registerer (prometheus.DefaultRegisterer for the global registry)")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := &PaymentCollector{
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "payment_callbacks_total", ConstLabels: o.constLabels,
			Help: "Payment provider callbacks by result (acknowledged, replayed, refused-signature, refused-stale, refused-malformed, refused-too-large, refused-unavailable); exactly one per callback.",
		}, []string{"provider", "result"}),
		anomalies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "payment_anomalies_total", ConstLabels: o.constLabels,
			Help: "Payment callbacks whose event was recorded as an anomaly (unknown-order, amount-mismatch, refund-owed, ...), by reason; first deliveries only. idemctl anomalies lists them.",
		}, []string{"provider", "reason"}),
	}
	var err error
	if c.callbacks, err = register(reg, c.callbacks); err != nil {
		return nil, err
	}
	if c.anomalies, err = register(reg, c.anomalies); err != nil {
		return nil, err
	}
	for _, p := range o.providers {
		for _, r := range paymentResults {
			c.callbacks.WithLabelValues(p, string(r))
		}
		for _, r := range anomalyReasons {
			c.anomalies.WithLabelValues(p, string(r))
		}
	}
	return c, nil
}

// Observe counts one callback: one result, and its anomaly when a first
// delivery's event was recorded as one. Pass it as payment.Config.Observe.
func (c *PaymentCollector) Observe(obs payment.Observation) {
	result := PaymentResultOf(obs)
	c.callbacks.WithLabelValues(obs.Provider, string(result)).Inc()
	if result == PaymentAcknowledged && obs.Outcome.Anomaly != "" {
		c.anomalies.WithLabelValues(obs.Provider, string(obs.Outcome.Anomaly)).Inc()
	}
}
