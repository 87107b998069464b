package main

import (
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"time"

	"github.com/orderguard/idempotency/payment/wechatpay"
)

// WeChat Pay's API v3 callback, signed as its documentation says (the
// rules payment/wechatpay verifies): the payment or refund is a JSON
// resource encrypted AEAD_AES_256_GCM under the merchant's APIv3 key, in
// an envelope whose id is the event's; the envelope's bytes are signed
// SHA256withRSA (PKCS #1 v1.5) over "timestamp\nnonce\nbody\n" with the
// platform's private key, whose public half the merchant holds under the
// serial sent in Wechatpay-Serial.

// wechatpayKey is what WeChat Pay signs and encrypts with: its platform
// key (the public half is the server's -wechatpay-public-key), the key's
// serial, and the merchant's APIv3 key, shared by both sides.
type wechatpayKey struct {
	private  *rsa.PrivateKey
	serial   string
	apiV3Key string
}

// wechatpayMchID is the merchant the simulated callbacks are for (the
// verifier does not read it: the APIv3 key is the merchant's).
const wechatpayMchID = "1900000109"

// defaultWechatpaySerial is the serial of the simulated WeChat Pay public
// key, in the form of a real one's id.
const defaultWechatpaySerial = "PUB_KEY_ID_0119000000000000000000000001"

// wechatpayBody returns the envelope of ev, its resource encrypted with
// key's APIv3 key under a fresh nonce, as each notification carries one:
// TRANSACTION.SUCCESS with amount.total in fen, or REFUND.SUCCESS with
// this refund's amount.refund.
func wechatpayBody(key wechatpayKey, ev event) []byte {
	at := ev.At.In(chinaTime).Format(time.RFC3339)
	eventType, originalType, summary := "TRANSACTION.SUCCESS", "transaction", "支付成功"
	resource := map[string]any{
		"mchid": wechatpayMchID, "appid": "wxd678efh567hg6787", "out_trade_no": ev.OrderNo, "transaction_id": ev.PaymentID,
		"trade_type": "JSAPI", "trade_state": "SUCCESS", "trade_state_desc": "支付成功", "bank_type": "OTHERS",
		"success_time": at, "payer": map[string]any{"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
		"amount": map[string]any{"total": ev.Amount, "payer_total": ev.Amount, "currency": ev.Currency, "payer_currency": ev.Currency},
	}
	if ev.Kind == kindRefund {
		eventType, originalType, summary = "REFUND.SUCCESS", "refund", "退款成功"
		resource = map[string]any{
			"mchid": wechatpayMchID, "out_trade_no": ev.OrderNo, "transaction_id": ev.PaymentID,
			"out_refund_no": "R" + ev.RefundID, "refund_id": ev.RefundID, "refund_status": "SUCCESS",
			"success_time": at, "user_received_account": "招商银行信用卡0403",
			"amount": map[string]any{"total": ev.Total, "refund": ev.Amount, "payer_total": ev.Total, "payer_refund": ev.Amount},
		}
	}
	plaintext, _ := json.Marshal(resource)
	encrypted, err := wechatpay.Encrypt(key.apiV3Key, originalType, plaintext)
	if err != nil {
		panic(err) // parseFlags checked the key's length
	}
	body, _ := json.Marshal(map[string]any{
		"id":            ev.ID,
		"create_time":   at,
		"resource_type": "encrypt-resource",
		"event_type":    eventType,
		"summary":       summary,
		"resource":      encrypted,
	})
	return body
}

// wechatpaySign signs body at at as WeChat Pay does: the Wechatpay-*
// headers, a fresh nonce on every delivery.
func wechatpaySign(key any, _ event, body []byte, at time.Time) (http.Header, []byte, error) {
	k := key.(wechatpayKey)
	h, err := wechatpay.Sign(k.private, k.serial, at, body)
	return h, body, err
}

// wechatpayAcked: WeChat Pay stops on 200 or 204, whatever the body.
func wechatpayAcked(status int, _ []byte) bool {
	return status == http.StatusOK || status == http.StatusNoContent
}
