package frontendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

// WeChatPay plays WeChat Pay v3 against a webhook front-end
// (payment.Webhook, as orderservice.Service.PaymentWebhook serves it): it
// signs and encrypts each callback as WeChat Pay's documentation says
// (the resource AEAD_AES_256_GCM under the APIv3 key, the envelope
// SHA256withRSA over "timestamp\nnonce\nbody\n" with the platform's key,
// named by Wechatpay-Serial), and Verifier is the verifier that holds its
// keys. It is the standard library's provider with every flaw: a signed
// timestamp, so a stale callback too.
type WeChatPay struct {
	key, stranger *rsa.PrivateKey
	serial        string
	apiV3Key      string
}

// NewWeChatPay returns a WeChat Pay with fresh keys.
func NewWeChatPay(t *testing.T) *WeChatPay {
	t.Helper()
	return &WeChatPay{key: testRSAKey(0), stranger: testRSAKey(1), serial: "PUB_KEY_ID_0119000000000000000000000042",
		apiV3Key: "the suite's APIv3 key, 32 bytes."}
}

// testRSAKeys are made once per run: RSA keygen is slow.
var testRSAKeys = sync.OnceValue(func() [2]*rsa.PrivateKey {
	var keys [2]*rsa.PrivateKey
	for i := range keys {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		keys[i] = k
	}
	return keys
})

func testRSAKey(i int) *rsa.PrivateKey { return testRSAKeys()[i] }

// Verifier returns the webhook's verifier of this WeChat Pay's callbacks.
func (p *WeChatPay) Verifier(t *testing.T) payment.Verifier {
	t.Helper()
	v, err := wechatpay.New(wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{p.serial: &p.key.PublicKey}, APIv3Key: p.apiV3Key})
	require.NoError(t, err)
	return v
}

// Webhook returns WeChat Pay's client of the webhook route at url.
func (p *WeChatPay) Webhook(url string) PaymentFrontend { return wechatpayWebhook{p: p, url: url} }

type wechatpayWebhook struct {
	p   *WeChatPay
	url string
}

func (w wechatpayWebhook) Deliver(ctx context.Context, c Callback) Answer {
	p := w.p
	at, key := time.Now(), p.key
	claimed := c
	switch c.Flaw {
	case Forged:
		key = p.stranger
	case Stale:
		at = at.Add(-time.Hour)
	case Malformed:
		c.OrderNo = ""
	case Tampered:
		c.Amount = 1 // what was signed
	}
	body := p.envelope(c, c.Flaw == Oversize)
	h := p.sign(key, at, body)
	switch c.Flaw {
	case Unsigned:
		h = http.Header{}
	case Tampered:
		body = p.envelope(claimed, false)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return Answer{Err: err}
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{Err: err}
	}
	return WebhookAnswer(resp.StatusCode, resp.Header, raw)
}

// WebhookAnswer reads a webhook's answer: the status, Retry-After, the
// body as Raw.
func WebhookAnswer(status int, h http.Header, body []byte) Answer {
	return Answer{Status: status, RetryAfter: h.Get("Retry-After") != "",
		Raw: strconv.Itoa(status) + " " + h.Get("Content-Type") + "\n" + string(body)}
}

// envelope is c's notification, its resource encrypted under a fresh
// nonce; pad pads it past payment.MaxBodyBytes.
func (p *WeChatPay) envelope(c Callback, pad bool) []byte {
	eventType, originalType := "TRANSACTION.SUCCESS", "transaction"
	resource := map[string]any{
		"mchid": "1900000109", "appid": "wxd678efh567hg6787", "out_trade_no": c.OrderNo, "transaction_id": c.PaymentID,
		"trade_type": "JSAPI", "trade_state": "SUCCESS", "success_time": "2024-06-11T22:33:59+08:00",
		"amount": map[string]any{"total": c.Amount, "payer_total": c.Amount, "currency": c.Currency, "payer_currency": c.Currency},
	}
	if c.Kind == payment.Refunded {
		eventType, originalType = "REFUND.SUCCESS", "refund"
		resource = map[string]any{
			"mchid": "1900000109", "out_trade_no": c.OrderNo, "transaction_id": c.PaymentID, "out_refund_no": "R" + c.RefundID,
			"refund_id": c.RefundID, "refund_status": "SUCCESS", "success_time": "2024-06-12T10:00:00+08:00",
			"amount": map[string]any{"total": c.Amount, "refund": c.Amount, "payer_total": c.Amount, "payer_refund": c.Amount},
		}
	}
	plaintext, _ := json.Marshal(resource)
	encrypted, err := wechatpay.Encrypt(p.apiV3Key, originalType, plaintext)
	if err != nil {
		panic(err)
	}
	env := map[string]any{
		"id": c.ID, "create_time": "2024-06-11T22:34:03+08:00", "resource_type": "encrypt-resource",
		"event_type": eventType, "summary": "支付成功", "resource": encrypted,
	}
	if pad {
		env["summary"] = strings.Repeat("x", payment.MaxBodyBytes)
	}
	body, _ := json.Marshal(env)
	return body
}

// sign is the Wechatpay-* headers of body signed by key at at.
func (p *WeChatPay) sign(key *rsa.PrivateKey, at time.Time, body []byte) http.Header {
	h, err := wechatpay.Sign(key, p.serial, at, body)
	if err != nil {
		panic(err)
	}
	return h
}
