package alipay

import (
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/orderguard/idempotency/payment"
)

// Provider is the name of Alipay in payment.Event.Provider.
const Provider = "alipay"

// Trade statuses (trade_status) of Alipay's notification.
const (
	// TradeWaitBuyerPay: the trade is created, not paid.
	TradeWaitBuyerPay = "WAIT_BUYER_PAY"
	// TradeClosed: closed unpaid, or closed by a full refund.
	TradeClosed = "TRADE_CLOSED"
	// TradeSuccess: paid, and refunds are still possible.
	TradeSuccess = "TRADE_SUCCESS"
	// TradeFinished: paid, and no refund is possible any more.
	TradeFinished = "TRADE_FINISHED"
)

// Errors of a notification signed by Alipay but not for this endpoint's
// merchant. Alipay's documentation tells the merchant to check them after
// the signature: Alipay's public key may be shared by the apps of one
// account, so a genuine notification of another app (or another seller's
// trade) verifies too. Both match payment.ErrSignature: the callback is not
// verified as this endpoint's, so it is refused (400, "fail"), counted,
// and nothing is written.
var (
	// ErrAppID: the notification's app_id is not Config.AppID.
	ErrAppID = fmt.Errorf("alipay: the notification's app_id is not Config.AppID; check the notify_url of the other app: %w", payment.ErrSignature)
	// ErrSellerID: Config.SellerID is set and the notification's
	// seller_id is another (or none).
	ErrSellerID = fmt.Errorf("alipay: the notification's seller_id is not Config.SellerID; check the merchant's PID: %w", payment.ErrSignature)
)

// Config configures a Verifier.
type Config struct {
	// PublicKey is Alipay's public key of the app (支付宝公钥, not the app's
	// own key), RSA of at least 2048 bits; read it with ParsePublicKey.
	// Required.
	PublicKey *rsa.PublicKey
	// AppID is the app whose notifications this endpoint takes (the
	// open platform's APPID, "2021…"): a notification signed for another
	// app is ErrAppID. Alipay's public key may be shared by the apps of
	// one account, so the signature alone does not tell them apart.
	// Required.
	AppID string
	// SellerID, when set, is the only seller_id accepted (the merchant's
	// PID, "2088…", the seller of the trade): a notification of another
	// seller's trade, or of none, is ErrSellerID. Set it when one app
	// serves several sellers, or to check what Alipay's documentation
	// asks merchants to check. Defaults to "" (seller_id not checked).
	SellerID string
	// MaxBodyBytes is the largest body accepted; a larger one is
	// payment.ErrTooLarge. Defaults to payment.MaxBodyBytes.
	MaxBodyBytes int
}

// Verifier verifies Alipay's asynchronous notifications. It is a
// payment.Verifier, safe for concurrent use.
type Verifier struct {
	key          *rsa.PublicKey
	appID        string
	sellerID     string
	maxBodyBytes int
}

var _ payment.Verifier = (*Verifier)(nil)

// New returns a Verifier, or an error saying what in cfg to fix.
func New(cfg Config) (*Verifier, error) {
	if cfg.PublicKey == nil {
		return nil, errors.New("alipay: Config.PublicKey is nil; set Alipay's public key (ParsePublicKey)")
	}
	if bits := cfg.PublicKey.N.BitLen(); bits < 2048 {
		return nil, fmt.Errorf("alipay: Config.PublicKey has %d bits; RSA2 keys have at least 2048", bits)
	}
	if cfg.AppID == "" {
		return nil, errors.New("alipay: Config.AppID is empty; set the APPID of the app whose notify_url this is (Alipay's key may be shared by several apps)")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("alipay: Config.MaxBodyBytes is %d; leave it 0 for the default", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = payment.MaxBodyBytes
	}
	return &Verifier{key: cfg.PublicKey, appID: cfg.AppID, sellerID: cfg.SellerID, maxBodyBytes: cfg.MaxBodyBytes}, nil
}

// Provider returns "alipay".
func (v *Verifier) Provider() string { return Provider }

// Verify checks the notification's sign over its form body, then that it
// is this merchant's (app_id is Config.AppID, else ErrAppID; seller_id is
// Config.SellerID when that is set, else ErrSellerID), and reads its
// event. Alipay signs no header and no timestamp, so header and now are
// not used (see the package doc: there is no tolerance).
//
// The event:
//
//   - ID is notify_id, the same on every redelivery; Scope is app_id;
//     Type is trade_status; OrderNo is out_trade_no; PaymentID is
//     trade_no; Currency is "CNY"; Digest is the SHA-256 of the signed
//     content without notify_time, which changes on every redelivery.
//   - A notification carrying refund_fee is a refund notice, whatever its
//     trade_status (TRADE_SUCCESS after a partial refund, TRADE_CLOSED
//     after a full one): Refunded, Amount refund_fee. Alipay's refund_fee
//     is the trade's total refunded so far, so RefundID is "" as
//     payment.Refunded defines; out_biz_no, the refund request's number,
//     is not used as RefundID since the amount is not that refund's.
//   - Otherwise TRADE_SUCCESS and TRADE_FINISHED are Succeeded, Amount
//     total_amount. A trade that allows refunds is notified twice, first
//     TRADE_SUCCESS then TRADE_FINISHED when the refund period ends (where
//     the app subscribes to both): two Succeeded events with distinct ids
//     for one payment, which the order applies once, by PaymentID.
//   - TRADE_CLOSED without refund_fee (closed unpaid) and WAIT_BUYER_PAY
//     are Ignored.
//   - Any other trade_status is payment.ErrMalformed: an unknown state is
//     refused, and so redelivered, rather than acknowledged unread.
//
// Amounts are yuan with two decimals, read by payment.ParseDecimal at
// scale 2; Alipay's domestic trades are in CNY. A notification with a
// trans_currency other than CNY (a cross-border trade, whose total_amount
// is in that currency) is payment.ErrMalformed: this package does not read
// cross-border amounts rather than misread them.
func (v *Verifier) Verify(header http.Header, body []byte, now time.Time) (payment.Event, error) {
	if len(body) > v.maxBodyBytes {
		return payment.Event{}, fmt.Errorf("alipay: body of %d bytes is over %d: %w", len(body), v.maxBodyBytes, payment.ErrTooLarge)
	}
	params, err := verifySignature(v.key, body)
	if err != nil {
		return payment.Event{}, err
	}
	// Signed by Alipay, but is it this merchant's? Checked before
	// anything is read: another app's notification is refused whole.
	if params["app_id"] != v.appID {
		return payment.Event{}, fmt.Errorf("app_id %q: %w", params["app_id"], ErrAppID)
	}
	if v.sellerID != "" && params["seller_id"] != v.sellerID {
		return payment.Event{}, fmt.Errorf("seller_id %q: %w", params["seller_id"], ErrSellerID)
	}
	// The digest is the notification's content, not its bytes: each
	// redelivery is sent anew, with its own notify_time (the time it was
	// sent) and any order of parameters, and must still be the same
	// event, never a same-id event with another payload.
	content := make(map[string]string, len(params))
	for k, v := range params {
		if k != "notify_time" {
			content[k] = v
		}
	}
	digest := sha256.Sum256([]byte(signedContent(content)))
	return readEvent(params, hex.EncodeToString(digest[:]))
}

// readEvent reads the event of a verified notification.
func readEvent(params map[string]string, digest string) (payment.Event, error) {
	ev := payment.Event{
		Provider:  Provider,
		ID:        params["notify_id"],
		Scope:     params["app_id"],
		Type:      params["trade_status"],
		OrderNo:   params["out_trade_no"],
		PaymentID: params["trade_no"],
		Digest:    digest,
	}
	if ev.ID == "" {
		return payment.Event{}, malformed("no notify_id")
	}
	if ev.Type == "" {
		return payment.Event{}, malformed("no trade_status")
	}
	// An empty value is read as an absent one: the signature covers it
	// either way (empty values are signed), and Alipay omits what it has
	// not.
	if c := params["trans_currency"]; c != "" && c != "CNY" {
		return payment.Event{}, malformed(fmt.Sprintf("trans_currency %q: cross-border amounts are not read", c))
	}
	refundFee := params["refund_fee"]
	refunded := refundFee != ""
	switch ev.Type {
	case TradeSuccess, TradeFinished, TradeClosed:
		switch {
		case refunded:
			ev.Kind = payment.Refunded
			return withAmount(ev, "refund_fee", refundFee)
		case ev.Type == TradeClosed:
			ev.Kind = payment.Ignored
			return ev, nil
		default:
			ev.Kind = payment.Succeeded
			return withAmount(ev, "total_amount", params["total_amount"])
		}
	case TradeWaitBuyerPay:
		ev.Kind = payment.Ignored
		return ev, nil
	default:
		return payment.Event{}, malformed(fmt.Sprintf("trade_status %q is not one Alipay documents", ev.Type))
	}
}

// withAmount completes a Succeeded or Refunded event with its amount,
// order and payment.
func withAmount(ev payment.Event, field, amount string) (payment.Event, error) {
	if ev.OrderNo == "" {
		return payment.Event{}, malformed("no out_trade_no")
	}
	if ev.PaymentID == "" {
		return payment.Event{}, malformed("no trade_no")
	}
	if amount == "" {
		return payment.Event{}, malformed("no " + field)
	}
	minor, err := payment.ParseDecimal(amount, 2)
	if err != nil {
		return payment.Event{}, fmt.Errorf("alipay: %s: %w", field, err)
	}
	ev.Amount = minor
	ev.Currency = "CNY"
	return ev, nil
}

func malformed(why string) error {
	return fmt.Errorf("alipay: %s: %w", why, payment.ErrMalformed)
}

// Acknowledge answers 200 with the plain body "success", the only answer
// that stops Alipay's redelivery.
func (v *Verifier) Acknowledge(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("success"))
}

// Refuse answers status with the plain body "fail". Alipay redelivers any
// answer but "success", whatever its status; message is not sent (Alipay
// shows no answer text to anyone), so log it. A status outside 4xx and 5xx
// is written as 500, since a refusal is never a success.
func (v *Verifier) Refuse(w http.ResponseWriter, status int, message string) {
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte("fail"))
}
