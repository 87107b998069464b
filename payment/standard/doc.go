// Package idemstandard verifies webhooks signed as the Standard Webhooks
// specification says (https://www.standardwebhooks.com; Svix and many
// providers send them), with the specification's own Go library, and
// reads a small payment event schema, defined here, as payment events.
//
// # Verification
//
// Three headers carry the signature: webhook-id (the message id, the same
// on every delivery of a message), webhook-timestamp (Unix seconds of this
// delivery) and webhook-signature, a space-separated list of "v1,<base64>"
// signatures, one per secret the sender signs with. The signed content is
// "<webhook-id>.<webhook-timestamp>.<body>", HMAC-SHA256 with the
// base64-decoded secret (written "whsec_<base64>").
//
// The library's Verify checks the timestamp against time.Now, with a
// tolerance of its own that cannot be set, so Verifier.Verify calls its
// VerifyIgnoringTimestamp, once per configured secret (the message
// verifies when any secret verifies one of its signatures: a secret being
// rolled is listed beside its successor), and then checks the timestamp
// against Verify's now: more than Config.Tolerance away, in either
// direction, is payment.ErrStale. The signature is checked first, so an
// unsigned stale message is payment.ErrSignature; a missing header, an
// unreadable timestamp or no matching signature are payment.ErrSignature
// (and also match the library's ErrRequiredHeaders, ErrInvalidHeaders,
// ErrNoMatchingSignature). Senders sign every delivery afresh, so a retry
// hours later carries a current timestamp and the same webhook-id.
//
// Only after that is the body read.
//
// # The payment event schema
//
// The body is a JSON object in the Standard Webhooks payload shape:
//
//	{
//	  "type": "payment.succeeded",
//	  "timestamp": "2025-03-14T09:26:53Z",
//	  "data": {
//	    "order_no": "A-1001",
//	    "payment_id": "pay_7Hq2",
//	    "amount": 1999,
//	    "currency": "USD"
//	  }
//	}
//
// and a refund:
//
//	{
//	  "type": "payment.refunded",
//	  "timestamp": "2025-03-15T10:00:00Z",
//	  "data": {
//	    "order_no": "A-1001",
//	    "payment_id": "pay_7Hq2",
//	    "refund_id": "rf_91",
//	    "amount": 500,
//	    "currency": "USD"
//	  }
//	}
//
// The fields:
//
//   - type: a string, required. "payment.succeeded" is payment.Succeeded,
//     "payment.refunded" is payment.Refunded; any other type is
//     payment.Ignored and the rest of the body is not read (a sender's
//     other events share the endpoint).
//   - timestamp: required, RFC 3339: when the event happened at the
//     sender. It is not compared with now (webhook-timestamp, which is
//     signed per delivery, is the replay guard).
//   - data.order_no: the merchant's order number, required for
//     payment.succeeded, optional for payment.refunded (a refund names its
//     payment).
//   - data.payment_id: the sender's id of the payment, required.
//   - data.refund_id: payment.refunded only, optional. With it, amount is
//     this refund's amount; without it, amount is the payment's whole
//     refunded amount so far (as payment.Refunded defines). On
//     payment.succeeded it is malformed.
//   - data.amount: required, a JSON integer ≥ 0 in the currency's minor
//     units (1999 is 19.99 USD). A fraction or exponent (19.99, 1999.0,
//     2e3), a string ("1999"), a negative number or null is malformed.
//   - data.currency: required, an ISO 4217 code in three upper-case
//     letters ("USD").
//
// Unknown fields are ignored, so a sender may add its own. A signed body
// that breaks these rules is payment.ErrMalformed.
//
// The event: ID is the webhook-id header (the idempotency key, covered by
// the signature), Scope is "" (one sender per endpoint), Type is type,
// Digest is the SHA-256 of the raw body, and the rest is read from data.
//
// # Answers and senders
//
// Standard Webhooks senders retry until they get a 2xx answer:
// Verifier.Acknowledge answers 204, Verifier.Refuse the status and a plain
// message. Sign is for senders (the example simulator, other packages'
// tests): it returns the three headers of a signed message.
package idemstandard
