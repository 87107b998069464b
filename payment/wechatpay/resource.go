package wechatpay

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/orderguard/idempotency/payment"
)

// Event types (event_type) this package reads; every other one is
// payment.Ignored.
const (
	// EventTransactionSuccess: a payment succeeded (支付成功通知).
	EventTransactionSuccess = "TRANSACTION.SUCCESS"
	// EventRefundSuccess: a refund succeeded (退款成功通知). REFUND.ABNORMAL
	// and REFUND.CLOSED move no money and are Ignored.
	EventRefundSuccess = "REFUND.SUCCESS"
)

// algorithmAEAD is the only resource.algorithm WeChat Pay documents.
const algorithmAEAD = "AEAD_AES_256_GCM"

// ErrDecrypt: the envelope is signed by WeChat Pay, but its resource does
// not decrypt with Config.APIv3Key: the key was changed in the merchant
// platform and not here, or the callback is another merchant's. It matches
// payment.ErrSignature too: GCM's tag is the resource's authentication, and
// it failed, so the callback is refused and WeChat Pay delivers it again
// (once the key is fixed, the redelivery is read).
var ErrDecrypt = fmt.Errorf("wechatpay: the resource does not decrypt with Config.APIv3Key; check the APIv3 key set in the merchant platform: %w", payment.ErrSignature)

// envelope is the callback's body.
type envelope struct {
	ID           string `json:"id"`
	CreateTime   string `json:"create_time"`
	EventType    string `json:"event_type"`
	ResourceType string `json:"resource_type"`
	Summary      string `json:"summary"`
	Resource     *struct {
		Algorithm      string `json:"algorithm"`
		Ciphertext     string `json:"ciphertext"`
		AssociatedData string `json:"associated_data"`
		Nonce          string `json:"nonce"`
		OriginalType   string `json:"original_type"`
	} `json:"resource"`
}

// transaction is the decrypted resource of TRANSACTION.SUCCESS.
type transaction struct {
	OutTradeNo    string `json:"out_trade_no"`
	TransactionID string `json:"transaction_id"`
	TradeState    string `json:"trade_state"`
	Amount        *struct {
		Total      *int64 `json:"total"`
		PayerTotal *int64 `json:"payer_total"`
		Currency   string `json:"currency"`
	} `json:"amount"`
}

// refund is the decrypted resource of REFUND.SUCCESS.
type refund struct {
	OutTradeNo    string `json:"out_trade_no"`
	TransactionID string `json:"transaction_id"`
	RefundID      string `json:"refund_id"`
	OutRefundNo   string `json:"out_refund_no"`
	RefundStatus  string `json:"refund_status"`
	Amount        *struct {
		Total       *int64 `json:"total"`
		Refund      *int64 `json:"refund"`
		PayerTotal  *int64 `json:"payer_total"`
		PayerRefund *int64 `json:"payer_refund"`
		// Currency is not in the documented refund notice, whose amounts
		// are fen of CNY; read it should it be sent.
		Currency string `json:"currency"`
	} `json:"amount"`
}

// readEvent reads the event of a verified body: the envelope, then its
// decrypted resource.
func readEvent(body []byte, apiV3Key []byte) (payment.Event, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return payment.Event{}, malformed(fmt.Sprintf("body is not the notification's JSON: %v", err))
	}
	if env.ID == "" {
		return payment.Event{}, malformed("no id")
	}
	if env.EventType == "" {
		return payment.Event{}, malformed("no event_type")
	}
	if env.Resource == nil {
		return payment.Event{}, malformed("no resource")
	}
	plaintext, err := decrypt(apiV3Key, env.Resource.Algorithm, env.Resource.Nonce, env.Resource.AssociatedData, env.Resource.Ciphertext)
	if err != nil {
		return payment.Event{}, err
	}
	digest := sha256.Sum256(plaintext)
	ev := payment.Event{
		Provider: Provider,
		ID:       env.ID,
		Type:     env.EventType,
		Kind:     payment.Ignored,
		Digest:   hex.EncodeToString(digest[:]),
	}
	switch env.EventType {
	case EventTransactionSuccess:
		return readTransaction(ev, plaintext)
	case EventRefundSuccess:
		return readRefund(ev, plaintext)
	default:
		return ev, nil
	}
}

// decrypt opens the resource with AEAD_AES_256_GCM under the APIv3 key.
func decrypt(key []byte, algorithm, nonce, associatedData, ciphertext string) ([]byte, error) {
	if algorithm != algorithmAEAD {
		return nil, malformed(fmt.Sprintf("resource.algorithm %q, want %s", algorithm, algorithmAEAD))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("wechatpay: %w", err) // New checked the key's length.
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("wechatpay: %w", err)
	}
	if len(nonce) != aead.NonceSize() {
		return nil, malformed(fmt.Sprintf("resource.nonce has %d bytes, want %d", len(nonce), aead.NonceSize()))
	}
	sealed, err := base64.StdEncoding.DecodeString(ciphertext)
	if err != nil {
		return nil, malformed("resource.ciphertext is not base64")
	}
	plaintext, err := aead.Open(nil, []byte(nonce), sealed, []byte(associatedData))
	if err != nil {
		return nil, ErrDecrypt
	}
	return plaintext, nil
}

func readTransaction(ev payment.Event, plaintext []byte) (payment.Event, error) {
	var tx transaction
	if err := json.Unmarshal(plaintext, &tx); err != nil {
		return payment.Event{}, malformed(fmt.Sprintf("resource is not a transaction: %v", err))
	}
	switch {
	case tx.TradeState != "SUCCESS":
		return payment.Event{}, malformed(fmt.Sprintf("%s with trade_state %q", ev.Type, tx.TradeState))
	case tx.OutTradeNo == "":
		return payment.Event{}, malformed("no out_trade_no")
	case tx.TransactionID == "":
		return payment.Event{}, malformed("no transaction_id")
	case tx.Amount == nil || tx.Amount.Total == nil:
		return payment.Event{}, malformed("no amount.total")
	case *tx.Amount.Total < 0:
		return payment.Event{}, malformed("negative amount.total")
	case !isCurrencyCode(tx.Amount.Currency):
		return payment.Event{}, malformed(fmt.Sprintf("amount.currency %q is not an ISO 4217 code", tx.Amount.Currency))
	}
	ev.Kind = payment.Succeeded
	ev.OrderNo = tx.OutTradeNo
	ev.PaymentID = tx.TransactionID
	ev.Amount = *tx.Amount.Total
	ev.Currency = tx.Amount.Currency
	return ev, nil
}

func readRefund(ev payment.Event, plaintext []byte) (payment.Event, error) {
	var r refund
	if err := json.Unmarshal(plaintext, &r); err != nil {
		return payment.Event{}, malformed(fmt.Sprintf("resource is not a refund: %v", err))
	}
	currency := "CNY"
	if r.Amount != nil && r.Amount.Currency != "" {
		currency = r.Amount.Currency
	}
	switch {
	case r.RefundStatus != "SUCCESS":
		return payment.Event{}, malformed(fmt.Sprintf("%s with refund_status %q", ev.Type, r.RefundStatus))
	case r.RefundID == "":
		return payment.Event{}, malformed("no refund_id")
	case r.OutTradeNo == "":
		return payment.Event{}, malformed("no out_trade_no")
	case r.TransactionID == "":
		return payment.Event{}, malformed("no transaction_id")
	case r.Amount == nil || r.Amount.Refund == nil:
		return payment.Event{}, malformed("no amount.refund")
	case *r.Amount.Refund < 0:
		return payment.Event{}, malformed("negative amount.refund")
	case !isCurrencyCode(currency):
		return payment.Event{}, malformed(fmt.Sprintf("amount.currency %q is not an ISO 4217 code", currency))
	}
	ev.Kind = payment.Refunded
	ev.OrderNo = r.OutTradeNo
	ev.PaymentID = r.TransactionID
	ev.RefundID = r.RefundID
	ev.Amount = *r.Amount.Refund
	ev.Currency = currency
	return ev, nil
}

// isCurrencyCode reports whether c has the form of an ISO 4217 code: three
// upper-case letters.
func isCurrencyCode(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

func malformed(why string) error {
	return fmt.Errorf("wechatpay: %s: %w", why, payment.ErrMalformed)
}
