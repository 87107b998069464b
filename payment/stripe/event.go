package idemstripe

import (
	"encoding/json"
	"fmt"
	"strings"

	stripe "github.com/stripe/stripe-go/v82"

	"github.com/orderguard/idempotency/payment"
)

// OrderNoKey is the metadata key that names the merchant's order number on
// a PaymentIntent, a charge or a refund.
const OrderNoKey = "order_no"

// readEvent reads the event of a verified Stripe event.
func readEvent(se stripe.Event, digest string) (payment.Event, error) {
	ev := payment.Event{
		Provider: Provider,
		ID:       se.ID,
		Scope:    se.Account,
		Type:     string(se.Type),
		Digest:   digest,
	}
	if ev.ID == "" {
		return payment.Event{}, malformed("no event id")
	}
	if ev.Type == "" {
		return payment.Event{}, malformed("no event type")
	}
	switch se.Type {
	case stripe.EventTypePaymentIntentSucceeded:
		return readPaymentIntent(ev, se)
	case stripe.EventTypeChargeRefunded:
		return readChargeRefunded(ev, se)
	case stripe.EventTypeRefundCreated, stripe.EventTypeRefundUpdated, stripe.EventTypeChargeRefundUpdated:
		return readRefund(ev, se)
	default:
		ev.Kind = payment.Ignored
		return ev, nil
	}
}

// readPaymentIntent reads payment_intent.succeeded.
func readPaymentIntent(ev payment.Event, se stripe.Event) (payment.Event, error) {
	var pi stripe.PaymentIntent
	if err := decodeObject(se, "payment_intent", &pi); err != nil {
		return payment.Event{}, err
	}
	if pi.ID == "" {
		return payment.Event{}, malformed("payment_intent without id")
	}
	currency, err := readCurrency(pi.Currency)
	if err != nil {
		return payment.Event{}, err
	}
	ev.Kind = payment.Succeeded
	// "" when the merchant set no order_no: still Succeeded, see the
	// package doc.
	ev.OrderNo = pi.Metadata[OrderNoKey]
	ev.PaymentID = pi.ID
	ev.Amount = pi.AmountReceived
	ev.Currency = currency
	return ev, nil
}

// readChargeRefunded reads charge.refunded: the charge's cumulative
// refunded amount.
func readChargeRefunded(ev payment.Event, se stripe.Event) (payment.Event, error) {
	var ch stripe.Charge
	if err := decodeObject(se, "charge", &ch); err != nil {
		return payment.Event{}, err
	}
	if ch.ID == "" {
		return payment.Event{}, malformed("charge without id")
	}
	currency, err := readCurrency(ch.Currency)
	if err != nil {
		return payment.Event{}, err
	}
	ev.Kind = payment.Refunded
	ev.OrderNo = ch.Metadata[OrderNoKey]
	ev.PaymentID = paymentID(ch.PaymentIntent, ch.ID)
	ev.Amount = ch.AmountRefunded
	ev.Currency = currency
	return ev, nil
}

// readRefund reads refund.created, refund.updated and
// charge.refund.updated: one refund, effective once it succeeded.
func readRefund(ev payment.Event, se stripe.Event) (payment.Event, error) {
	var re stripe.Refund
	if err := decodeObject(se, "refund", &re); err != nil {
		return payment.Event{}, err
	}
	if re.ID == "" {
		return payment.Event{}, malformed("refund without id")
	}
	if re.Status != stripe.RefundStatusSucceeded {
		// pending and requires_action may still succeed (another event
		// tells it); failed and canceled never moved money.
		ev.Kind = payment.Ignored
		return ev, nil
	}
	var chargeID string
	if re.Charge != nil {
		chargeID = re.Charge.ID
	}
	ev.PaymentID = paymentID(re.PaymentIntent, chargeID)
	if ev.PaymentID == "" {
		return payment.Event{}, malformed(fmt.Sprintf("refund %s names neither a payment_intent nor a charge", re.ID))
	}
	currency, err := readCurrency(re.Currency)
	if err != nil {
		return payment.Event{}, err
	}
	ev.Kind = payment.Refunded
	ev.OrderNo = re.Metadata[OrderNoKey]
	ev.RefundID = re.ID
	ev.Amount = re.Amount
	ev.Currency = currency
	return ev, nil
}

// decodeObject decodes the event's data.object into v after checking that
// it is an object of the kind the event type promises.
func decodeObject(se stripe.Event, object string, v any) error {
	if se.Data == nil || len(se.Data.Raw) == 0 {
		return malformed("no data.object")
	}
	var head struct {
		Object string `json:"object"`
	}
	if err := json.Unmarshal(se.Data.Raw, &head); err != nil {
		return malformed("data.object: " + err.Error())
	}
	if head.Object != object {
		return malformed(fmt.Sprintf("%s carries a %q object, not a %q", se.Type, head.Object, object))
	}
	if err := json.Unmarshal(se.Data.Raw, v); err != nil {
		return malformed(fmt.Sprintf("data.object %s: %v", object, err))
	}
	return nil
}

// paymentID names the payment: the PaymentIntent, or the charge where there
// is none (the legacy Charges API).
func paymentID(pi *stripe.PaymentIntent, chargeID string) string {
	if pi != nil && pi.ID != "" {
		return pi.ID
	}
	return chargeID
}

// readCurrency upper-cases Stripe's lower-case ISO 4217 code.
func readCurrency(c stripe.Currency) (string, error) {
	s := strings.ToUpper(string(c))
	if len(s) != 3 {
		return "", malformed(fmt.Sprintf("currency %q is not an ISO 4217 code", c))
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return "", malformed(fmt.Sprintf("currency %q is not an ISO 4217 code", c))
		}
	}
	return s, nil
}

func malformed(why string) error {
	return fmt.Errorf("idemstripe: %s: %w", why, payment.ErrMalformed)
}
