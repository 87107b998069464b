package idemstandard

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/orderguard/idempotency/payment"
)

// The event types of the payment event schema (see the package doc).
const (
	// TypePaymentSucceeded: a payment of an order succeeded.
	TypePaymentSucceeded = "payment.succeeded"
	// TypePaymentRefunded: money of a payment was refunded.
	TypePaymentRefunded = "payment.refunded"
)

// message is a body in the Standard Webhooks payload shape.
type message struct {
	Type      *string         `json:"type"`
	Timestamp *string         `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// paymentData is data of the two payment types.
type paymentData struct {
	OrderNo   string          `json:"order_no"`
	PaymentID string          `json:"payment_id"`
	RefundID  *string         `json:"refund_id"`
	Amount    json.RawMessage `json:"amount"`
	Currency  string          `json:"currency"`
}

// readEvent reads the event of a verified message.
func readEvent(id string, body []byte, digest string) (payment.Event, error) {
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return payment.Event{}, malformed("body is not a JSON object of the schema: " + err.Error())
	}
	if m.Type == nil || *m.Type == "" {
		return payment.Event{}, malformed("no type")
	}
	ev := payment.Event{Provider: Provider, ID: id, Type: *m.Type, Digest: digest}
	switch ev.Type {
	case TypePaymentSucceeded:
		ev.Kind = payment.Succeeded
	case TypePaymentRefunded:
		ev.Kind = payment.Refunded
	default:
		ev.Kind = payment.Ignored
		return ev, nil
	}
	if m.Timestamp == nil {
		return payment.Event{}, malformed("no timestamp")
	}
	if _, err := time.Parse(time.RFC3339, *m.Timestamp); err != nil {
		return payment.Event{}, malformed(fmt.Sprintf("timestamp %q is not RFC 3339", *m.Timestamp))
	}
	if len(m.Data) == 0 || m.Data[0] != '{' {
		return payment.Event{}, malformed("data is not an object")
	}
	var d paymentData
	if err := json.Unmarshal(m.Data, &d); err != nil {
		return payment.Event{}, malformed("data: " + err.Error())
	}
	switch {
	case d.PaymentID == "":
		return payment.Event{}, malformed("no data.payment_id")
	case ev.Kind == payment.Succeeded && d.OrderNo == "":
		return payment.Event{}, malformed("no data.order_no in " + TypePaymentSucceeded)
	case ev.Kind == payment.Succeeded && d.RefundID != nil:
		return payment.Event{}, malformed("data.refund_id in " + TypePaymentSucceeded)
	case d.RefundID != nil && *d.RefundID == "":
		return payment.Event{}, malformed("data.refund_id is empty; leave it out for the whole refunded amount")
	}
	amount, err := readAmount(d.Amount)
	if err != nil {
		return payment.Event{}, err
	}
	if !isCurrency(d.Currency) {
		return payment.Event{}, malformed(fmt.Sprintf("data.currency %q is not three upper-case letters", d.Currency))
	}
	ev.OrderNo = d.OrderNo
	ev.PaymentID = d.PaymentID
	if d.RefundID != nil {
		ev.RefundID = *d.RefundID
	}
	ev.Amount = amount
	ev.Currency = d.Currency
	return ev, nil
}

// readAmount reads a JSON integer ≥ 0 from its raw text, so that a float
// or an exponent is refused rather than rounded.
func readAmount(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 {
		return 0, malformed("no data.amount")
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, malformed(fmt.Sprintf("data.amount %s is not a JSON integer ≥ 0 in minor units", raw))
		}
	}
	amount, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, malformed(fmt.Sprintf("data.amount %s is over the int64 range", raw))
	}
	return amount, nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

func malformed(why string) error {
	return fmt.Errorf("idemstandard: %s: %w", why, payment.ErrMalformed)
}
