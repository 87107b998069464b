// Package idemstripe verifies Stripe's webhook events with stripe-go's own
// webhook package and reads them as payment events (payment.Event).
//
// # Verification
//
// The Stripe-Signature header ("t=<unix>,v1=<hex>[,v1=<hex>…]") is checked
// over the raw body by webhook.ConstructEventWithOptions, once per
// configured secret: an event verifies when any secret verifies it, so an
// endpoint holds the old and the new secret while one is rolled. A missing,
// unreadable or wrong signature is payment.ErrSignature (and also matches
// stripe-go's own webhook.ErrNotSigned, webhook.ErrInvalidHeader or
// webhook.ErrNoValidSignature).
//
// stripe-go checks the signed timestamp against time.Now and offers no
// clock parameter, so the library is called with IgnoreTolerance and this
// package checks the timestamp t (the one the verified signature covers)
// against Verify's now: more than Config.Tolerance away, in either
// direction, is payment.ErrStale. stripe-go only refuses old timestamps;
// a timestamp far in the future is refused here too, as a clock far off.
// The signature is checked first, so an unsigned stale callback is
// payment.ErrSignature. No HMAC is computed here: only the tolerance is.
//
// The API version of the event is not checked (IgnoreAPIVersionMismatch):
// the fields read here (ids, amounts, currency, metadata, status) are the
// same in every API version of the endpoint.
//
// # Events
//
// ID is the event's id (evt_…), the same on every redelivery; Scope is the
// event's account (acct_…) for a Connect endpoint's events of connected
// accounts, "" for the platform's own; Type is the event's type; Digest is
// the SHA-256 of the raw body.
//
//   - payment_intent.succeeded is payment.Succeeded. OrderNo is
//     data.object.metadata.order_no, set by the merchant when it creates the
//     PaymentIntent; PaymentID is the PaymentIntent's id (pi_…); Amount is
//     amount_received, what was captured, which is less than amount after a
//     partial capture; Currency is upper-cased. A PaymentIntent without
//     metadata.order_no is still Succeeded, with OrderNo "": Stripe took the
//     money, and acknowledging it as Ignored would lose a payment nobody
//     can attribute; the order store records it as a payment of an unknown
//     order, an anomaly to reconcile.
//   - charge.refunded is payment.Refunded with the charge's amount_refunded,
//     the payment's whole refunded amount so far, and RefundID "". PaymentID
//     is the charge's payment_intent; OrderNo is the charge's
//     metadata.order_no, "" when the charge has none (Stripe does not copy
//     a PaymentIntent's metadata to its charges).
//   - refund.created, refund.updated and charge.refund.updated with the
//     refund's status "succeeded" are payment.Refunded with RefundID the
//     refund's id (re_…) and Amount that refund's amount. PaymentID is the
//     refund's payment_intent; OrderNo is the refund's metadata.order_no, ""
//     without. The other statuses (pending, requires_action, failed,
//     canceled) are payment.Ignored.
//   - Any other type is payment.Ignored.
//
// Where a charge or refund has no payment_intent (a charge of the legacy
// Charges API), PaymentID is the charge's id (ch_…), which no Succeeded
// event of this package names.
//
// One refund may be told several times: refund.created, refund.updated and
// charge.refund.updated (all "succeeded", distinct event ids, one
// RefundID), and charge.refunded with the cumulative amount. The order
// store (idempotency.Orders.ApplyPayment) applies one refund once by its
// RefundID, whichever of its events arrives first (the others are recorded
// and change nothing), and a cumulative amount as a total, not as one more
// refund: the payment's refunded amount is the larger of the sum of its
// distinct refunds and the largest total reported, so the two families
// never add up, in any delivery order, before or after the payment's
// success.
// A refund that fails after it succeeded (status "failed" in a later
// refund.updated or refund.failed) is Ignored: payment.Kind has no
// reversal, so it is for reconciliation with Stripe's dashboard.
//
// A signed event that cannot be read (no id, no object of the expected
// kind, an id or currency missing) is payment.ErrMalformed.
//
// Stripe retries until it gets a 2xx answer; Verifier.Acknowledge answers
// 200 {"received":true}, Verifier.Refuse the status and a plain message.
package idemstripe
