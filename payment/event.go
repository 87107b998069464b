// Package payment reads payment providers' signed callbacks as events of
// the order's life: a payment succeeded, a payment was refunded. Each
// provider has a Verifier (packages alipay and wechatpay here, with the
// standard library; idemstripe and idemstandard in modules of their own,
// with the providers' libraries) that checks the callback's signature over
// its raw body before anything is parsed, and reads the event.
//
// Every provider delivers at least once and in no promised order; the
// event's id is its idempotency key, so a redelivery is a replay, never a
// second effect.
package payment

import (
	"errors"
	"net/http"
	"time"
)

// Kind is what an event tells of a payment.
type Kind string

const (
	// Succeeded: the payment of an order succeeded; Amount is what was
	// paid.
	Succeeded Kind = "succeeded"
	// Refunded: money of a payment was refunded. Amount is this refund's
	// amount when RefundID names it; without a RefundID, Amount is the
	// payment's whole refunded amount so far (Alipay's refund_fee,
	// Stripe's charge.amount_refunded).
	Refunded Kind = "refunded"
	// Ignored: a verified event of a kind the order's life does not
	// follow (a customer created, a payment pending): acknowledged, no
	// effect.
	Ignored Kind = "ignored"
)

// Event is one verified callback, in the order store's terms.
type Event struct {
	// Provider names the provider: "stripe", "standard", "alipay",
	// "wechatpay".
	Provider string
	// ID is the provider's event id, the same on every delivery of the
	// event: the idempotency key.
	ID string
	// Scope owns the key: the provider's account (Stripe's account id),
	// "" when the provider has one account per endpoint.
	Scope string
	// Type is the provider's own name of the event
	// ("payment_intent.succeeded", "TRANSACTION.SUCCESS").
	Type string
	Kind Kind
	// OrderNo is the merchant's order number the payment is for (Stripe's
	// metadata.order_no, out_trade_no); "" when the event does not name
	// it (a Stripe refund names its charge only).
	OrderNo string
	// PaymentID is the provider's id of the payment (the payment intent,
	// trade_no, transaction_id): a refund names the payment.
	PaymentID string
	// RefundID is the provider's id of one refund; "" for a success, or a
	// refund event that reports the payment's whole refunded amount.
	RefundID string
	// Amount is in the currency's minor units (cents, fen), never a
	// float.
	Amount int64
	// Currency is the ISO 4217 code, upper case ("CNY", "USD").
	Currency string
	// Digest is the lowercase hex SHA-256 of the event's verified payload
	// (its raw body, or the decrypted resource): the action's
	// fingerprint, so that a same-id event with another payload is never
	// applied as if it were the first.
	Digest string
}

// Errors a Verifier returns, matched with errors.Is. Nothing is written
// for any of them: the callback is refused before anything is parsed.
var (
	// ErrSignature: the signature is missing, malformed or wrong, or
	// made with a key this endpoint does not hold (an unknown serial).
	ErrSignature = errors.New("payment: signature not verified")
	// ErrStale: the callback's timestamp is outside the tolerance: a
	// replay of an old callback, or a clock far off.
	ErrStale = errors.New("payment: timestamp outside the tolerance")
	// ErrMalformed: the callback is signed but cannot be read as an event
	// (a missing field, an amount that is not an exact decimal). Verifiers
	// check the signature first, so an unsigned malformed callback is
	// ErrSignature.
	ErrMalformed = errors.New("payment: malformed callback")
	// ErrTooLarge: the body is over the verifier's limit.
	ErrTooLarge = errors.New("payment: callback body too large")
)

// Verifier checks one provider's callbacks and reads their events.
type Verifier interface {
	// Provider names the provider, as Event.Provider.
	Provider() string
	// Verify checks the signature of a callback carried by header and
	// body (the raw body, byte for byte as received) at time now, and
	// only then reads its event. header keys are matched ignoring case.
	Verify(header http.Header, body []byte, now time.Time) (Event, error)
	// Acknowledge answers a handled callback in the provider's
	// convention (Stripe 200, Alipay the plain body "success", WeChat
	// Pay 204), so that it stops delivering it.
	Acknowledge(w http.ResponseWriter)
	// Refuse answers a callback that was not handled, with status, in the
	// provider's convention (WeChat Pay's {"code":"FAIL","message":…}):
	// the provider delivers it again.
	Refuse(w http.ResponseWriter, status int, message string)
}

// DefaultTolerance is how far a callback's timestamp may be from now
// where the provider signs one (Stripe, Standard Webhooks, WeChat Pay).
const DefaultTolerance = 5 * time.Minute

// MaxBodyBytes is the default limit of a callback's body.
const MaxBodyBytes = 64 << 10
