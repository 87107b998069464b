package main

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/orderguard/idempotency/payment/alipay"
	"github.com/orderguard/idempotency/payment/wechatpay"

	idemstandard "github.com/orderguard/idempotency/payment/standard"
	idemstripe "github.com/orderguard/idempotency/payment/stripe"
)

// eventKind is what a simulated provider event tells.
type eventKind string

const (
	kindSuccess eventKind = "success"
	kindRefund  eventKind = "refund"
)

// event is one provider event the simulator plays: the same id on every
// delivery, as providers do.
type event struct {
	ID        string
	Kind      eventKind
	OrderNo   string
	PaymentID string
	RefundID  string // refunds only
	Amount    int64  // minor units
	Currency  string // ISO 4217, upper case
	At        time.Time
	// Total is the order's total; Refunded, for a refund, the payment's
	// refunded amount with this refund (Alipay's refund_fee).
	Total, Refunded int64
}

// provider plays one payment provider: its event bodies, its signature and
// its endpoint on the server.
type provider struct {
	// Name is the provider as payment.Event.Provider names it.
	Name string
	// Path is the server's route for its callbacks.
	Path string
	// Secret is the endpoint's signing secret, the server's (Standard
	// Webhooks, Stripe); "" for a provider that signs with a key pair.
	Secret string
	// key signs genuine deliveries: Secret, an alipayKey or a
	// wechatpayKey (an RSA private key whose public half the server holds,
	// with the merchant's ids or the APIv3 key). stranger is a well-formed
	// key of the same kind the server does not hold: forgeries use it.
	key, stranger any
	// contentType is the deliveries' Content-Type.
	contentType string
	// signsTime: the signature covers the delivery's time, so a stale
	// delivery is refused. Alipay signs none: an old notification is
	// still genuine (and answered by its id).
	signsTime bool
	// body is the event's body, unsigned, as the provider sends it.
	body func(ev event) []byte
	// foreign is the body of the event for another merchant of the
	// provider's (another app), which the provider signs as genuinely;
	// nil where a callback names no merchant.
	foreign func(ev event) []byte
	// signWith signs body with key at at and returns what is sent: the
	// headers and the body (which carries the signature for Alipay).
	signWith func(key any, ev event, body []byte, at time.Time) (http.Header, []byte, error)
	// tamper returns a delivery of unsigned, a body other than the one
	// that was signed, carrying the signature of signed (h, body).
	tamper func(h http.Header, signed, unsigned []byte) (http.Header, []byte)
	// acked reports whether an answer stops the provider's deliveries.
	acked func(status int, body []byte) bool
}

// sign signs a genuine delivery of ev.
func (p *provider) sign(ev event, body []byte, at time.Time) (http.Header, []byte, error) {
	return p.signWith(p.key, ev, body, at)
}

// signAsStranger signs ev with a key the server does not hold.
func (p *provider) signAsStranger(ev event, body []byte, at time.Time) (http.Header, []byte, error) {
	return p.signWith(p.stranger, ev, body, at)
}

// providerNames are the providers the simulator plays, in -providers order.
var providerNames = []string{idemstandard.Provider, idemstripe.Provider, alipay.Provider, wechatpay.Provider}

// newProvider returns the provider name signing with key: a secret string
// (Standard Webhooks, Stripe), an alipayKey or a wechatpayKey.
func newProvider(name string, key any) (*provider, error) {
	secret, _ := key.(string)
	switch name {
	case idemstandard.Provider:
		return &provider{Name: name, Path: "/webhooks/standard", Secret: secret, key: secret, stranger: NewStandardSecret(),
			contentType: "application/json", signsTime: true, body: standardBody, signWith: standardSign,
			tamper: headerTamper, acked: acked2xx}, nil
	case idemstripe.Provider:
		return &provider{Name: name, Path: "/webhooks/stripe", Secret: secret, key: secret, stranger: NewStripeSecret(),
			contentType: "application/json", signsTime: true, body: stripeBody, signWith: stripeSign,
			tamper: headerTamper, acked: acked2xx}, nil
	case alipay.Provider:
		k, ok := key.(alipayKey)
		if !ok || k.private == nil || k.appID == "" {
			return nil, errors.New("alipay needs an RSA private key and the app id")
		}
		stranger, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, err
		}
		return &provider{Name: name, Path: "/webhooks/alipay", key: k, stranger: alipayKey{stranger, k.appID, k.sellerID},
			contentType: "application/x-www-form-urlencoded; charset=utf-8", body: func(ev event) []byte { return alipayBody(k, ev) },
			foreign:  func(ev event) []byte { return alipayBody(alipayKey{k.private, k.appID + "9", k.sellerID}, ev) },
			signWith: alipaySign, tamper: alipayTamper, acked: alipayAcked}, nil
	case wechatpay.Provider:
		k, ok := key.(wechatpayKey)
		if !ok || k.private == nil || k.serial == "" || len(k.apiV3Key) != 32 {
			return nil, errors.New("wechatpay needs an RSA private key, its serial and a 32-byte APIv3 key")
		}
		// The stranger claims the serial of WeChat Pay's key, and holds
		// the APIv3 key (a leaked one): only the signature gives it away.
		stranger, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, err
		}
		return &provider{Name: name, Path: "/webhooks/wechatpay", key: k, stranger: wechatpayKey{stranger, k.serial, k.apiV3Key},
			contentType: "application/json", signsTime: true, body: func(ev event) []byte { return wechatpayBody(k, ev) },
			signWith: wechatpaySign, tamper: headerTamper, acked: wechatpayAcked}, nil
	}
	return nil, fmt.Errorf("-providers: unknown provider %q; want %s", name, strings.Join(providerNames, ","))
}

func acked2xx(status int, _ []byte) bool { return status >= 200 && status < 300 }

// headerTamper sends unsigned with the headers signed for another body.
func headerTamper(h http.Header, _, unsigned []byte) (http.Header, []byte) { return h, unsigned }

// NewStandardSecret returns a fresh Standard Webhooks secret, whsec_<base64>.
func NewStandardSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:])
}

// NewStripeSecret returns a fresh Stripe endpoint secret, whsec_….
func NewStripeSecret() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return "whsec_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// standardBody is the payment event schema of idemstandard (its doc.go).
func standardBody(ev event) []byte {
	type data struct {
		OrderNo   string `json:"order_no"`
		PaymentID string `json:"payment_id"`
		RefundID  string `json:"refund_id,omitempty"`
		Amount    int64  `json:"amount"`
		Currency  string `json:"currency"`
	}
	typ := idemstandard.TypePaymentSucceeded
	if ev.Kind == kindRefund {
		typ = idemstandard.TypePaymentRefunded
	}
	b, _ := json.Marshal(struct {
		Type      string `json:"type"`
		Timestamp string `json:"timestamp"`
		Data      data   `json:"data"`
	}{typ, ev.At.UTC().Format(time.RFC3339), data{ev.OrderNo, ev.PaymentID, ev.RefundID, ev.Amount, ev.Currency}})
	return b
}

// standardSign signs with the Standard Webhooks library, through
// idemstandard.Sign: the event id is the webhook-id header.
func standardSign(secret any, ev event, body []byte, at time.Time) (http.Header, []byte, error) {
	h, err := idemstandard.Sign(secret.(string), ev.ID, at, body)
	return h, body, err
}

// stripeBody is a Stripe event as Stripe sends it: payment_intent.succeeded
// whose PaymentIntent carries metadata.order_no, or refund.created of a
// succeeded refund naming its payment_intent.
func stripeBody(ev event) []byte {
	currency := strings.ToLower(ev.Currency)
	meta := map[string]string{idemstripe.OrderNoKey: ev.OrderNo}
	var typ string
	var object any
	switch ev.Kind {
	case kindSuccess:
		typ = "payment_intent.succeeded"
		object = map[string]any{
			"id": ev.PaymentID, "object": "payment_intent", "amount": ev.Amount, "amount_received": ev.Amount,
			"currency": currency, "status": "succeeded", "metadata": meta,
		}
	default:
		typ = "refund.created"
		object = map[string]any{
			"id": ev.RefundID, "object": "refund", "amount": ev.Amount, "charge": "ch_" + strings.TrimPrefix(ev.PaymentID, "pi_"),
			"currency": currency, "payment_intent": ev.PaymentID, "status": "succeeded", "metadata": meta,
		}
	}
	b, _ := json.Marshal(map[string]any{
		"id":               ev.ID,
		"object":           "event",
		"account":          nil,
		"api_version":      "2025-03-31.basil",
		"created":          ev.At.Unix(),
		"livemode":         false,
		"pending_webhooks": 1,
		"request":          map[string]any{"id": nil, "idempotency_key": nil},
		"type":             typ,
		"data":             map[string]any{"object": object},
	})
	return b
}

// stripeSign signs as Stripe does, with stripe-go's own test signer: the
// Stripe-Signature header t=<unix>,v1=<hex>.
func stripeSign(secret any, _ event, body []byte, at time.Time) (http.Header, []byte, error) {
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret.(string), Timestamp: at})
	h := http.Header{}
	h.Set(idemstripe.SignatureHeader, p.Header)
	return h, body, nil
}
