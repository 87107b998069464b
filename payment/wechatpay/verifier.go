package wechatpay

import (
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency/payment"
)

// Provider is the name of WeChat Pay in payment.Event.Provider.
const Provider = "wechatpay"

// Config configures a Verifier.
type Config struct {
	// PlatformKeys are the keys that verify WeChat Pay's signatures, by
	// the serial a callback names in Wechatpay-Serial: the WeChat Pay
	// public key's id ("PUB_KEY_ID_…") or a platform certificate's serial
	// number (hex). Serials are matched ignoring case. Keep the old and
	// the new key both while WeChat Pay rotates them. Read keys with
	// ParsePublicKey. Required: at least one.
	PlatformKeys map[string]*rsa.PublicKey
	// APIv3Key is the merchant's APIv3 key (APIv3密钥), 32 bytes, which
	// decrypts the callback's resource. Required.
	APIv3Key string
	// Tolerance is how far Wechatpay-Timestamp may be from now, either
	// way. Defaults to payment.DefaultTolerance.
	Tolerance time.Duration
	// MaxBodyBytes is the largest body accepted; a larger one is
	// payment.ErrTooLarge. Defaults to payment.MaxBodyBytes.
	MaxBodyBytes int
}

// Verifier verifies WeChat Pay's API v3 callbacks. It is a
// payment.Verifier, safe for concurrent use.
type Verifier struct {
	keys         map[string]*rsa.PublicKey // by upper-case serial
	apiV3Key     []byte
	tolerance    time.Duration
	maxBodyBytes int
}

var _ payment.Verifier = (*Verifier)(nil)

// New returns a Verifier, or an error saying what in cfg to fix.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.PlatformKeys) == 0 {
		return nil, errors.New("wechatpay: Config.PlatformKeys is empty; add the WeChat Pay public key by its PUB_KEY_ID_ id, or the platform certificates by serial")
	}
	keys := make(map[string]*rsa.PublicKey, len(cfg.PlatformKeys))
	for serial, key := range cfg.PlatformKeys {
		if serial == "" {
			return nil, errors.New("wechatpay: Config.PlatformKeys has an empty serial")
		}
		if key == nil {
			return nil, fmt.Errorf("wechatpay: Config.PlatformKeys[%q] is nil", serial)
		}
		if bits := key.N.BitLen(); bits < 2048 {
			return nil, fmt.Errorf("wechatpay: Config.PlatformKeys[%q] has %d bits; WeChat Pay's keys have 2048", serial, bits)
		}
		if _, dup := keys[strings.ToUpper(serial)]; dup {
			return nil, fmt.Errorf("wechatpay: Config.PlatformKeys has serial %q twice, in different cases", serial)
		}
		keys[strings.ToUpper(serial)] = key
	}
	if len(cfg.APIv3Key) != 32 {
		return nil, fmt.Errorf("wechatpay: Config.APIv3Key has %d bytes; the APIv3 key set in the merchant platform has 32", len(cfg.APIv3Key))
	}
	if cfg.Tolerance < 0 {
		return nil, fmt.Errorf("wechatpay: Config.Tolerance is %v; leave it 0 for the default", cfg.Tolerance)
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = payment.DefaultTolerance
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("wechatpay: Config.MaxBodyBytes is %d; leave it 0 for the default", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = payment.MaxBodyBytes
	}
	return &Verifier{
		keys:         keys,
		apiV3Key:     []byte(cfg.APIv3Key),
		tolerance:    cfg.Tolerance,
		maxBodyBytes: cfg.MaxBodyBytes,
	}, nil
}

// Provider returns "wechatpay".
func (v *Verifier) Provider() string { return Provider }

// Verify checks the callback's signature headers over its body, then its
// timestamp, then decrypts its resource and reads the event:
//
//   - ID is the envelope's id, the same on every redelivery; Type is
//     event_type; Scope is "" (the APIv3 key that decrypts the resource is
//     one merchant's).
//   - TRANSACTION.SUCCESS (trade_state SUCCESS) is Succeeded: Amount is
//     amount.total in fen, what the order was paid (payer_total is what
//     the payer paid after coupons), Currency amount.currency, PaymentID
//     transaction_id, OrderNo out_trade_no.
//   - REFUND.SUCCESS (refund_status SUCCESS) is Refunded: RefundID is
//     refund_id and Amount is amount.refund, this refund's amount in fen;
//     PaymentID transaction_id, OrderNo out_trade_no. The refund notice
//     carries no currency; its amounts are CNY.
//   - Every other event_type (REFUND.ABNORMAL, REFUND.CLOSED, other
//     TRANSACTION.* types) is Ignored.
//   - Digest is the SHA-256 of the decrypted resource, not of the body: the
//     resource is the payment, while the envelope's create_time and summary
//     and the resource's random nonce are the delivery's, and need not be
//     the same on a redelivery.
//
// Errors: payment.ErrTooLarge; payment.ErrSignature for a missing or
// repeated header, an unknown serial, a signature that does not verify,
// and (ErrDecrypt) a resource that does not decrypt with the APIv3 key;
// payment.ErrStale for a timestamp outside the tolerance;
// payment.ErrMalformed for a verified callback that cannot be read.
func (v *Verifier) Verify(header http.Header, body []byte, now time.Time) (payment.Event, error) {
	if len(body) > v.maxBodyBytes {
		return payment.Event{}, fmt.Errorf("wechatpay: body of %d bytes is over %d: %w", len(body), v.maxBodyBytes, payment.ErrTooLarge)
	}
	h, err := readSignedHeaders(header)
	if err != nil {
		return payment.Event{}, err
	}
	key, ok := v.keys[strings.ToUpper(h.serial)]
	if !ok {
		return payment.Event{}, fmt.Errorf("wechatpay: %s %q is not in Config.PlatformKeys; add WeChat Pay's new key or certificate: %w", headerSerial, h.serial, payment.ErrSignature)
	}
	if err := verifySignature(key, h, body); err != nil {
		return payment.Event{}, err
	}
	if err := v.checkTimestamp(h.timestamp, now); err != nil {
		return payment.Event{}, err
	}
	return readEvent(body, v.apiV3Key)
}

// checkTimestamp checks a verified Wechatpay-Timestamp against now.
func (v *Verifier) checkTimestamp(timestamp string, now time.Time) error {
	for i := 0; i < len(timestamp); i++ {
		if timestamp[i] < '0' || timestamp[i] > '9' {
			return malformed(fmt.Sprintf("%s %q is not Unix seconds", headerTimestamp, timestamp))
		}
	}
	seconds, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return malformed(fmt.Sprintf("%s %q is not Unix seconds", headerTimestamp, timestamp))
	}
	skew := now.Sub(time.Unix(seconds, 0))
	if skew > v.tolerance || skew < -v.tolerance {
		return fmt.Errorf("wechatpay: %s is %v from now, over the %v tolerance: %w", headerTimestamp, skew, v.tolerance, payment.ErrStale)
	}
	return nil
}

// Acknowledge answers 204 with no body, which stops WeChat Pay's
// redelivery.
func (v *Verifier) Acknowledge(w http.ResponseWriter) {
	w.WriteHeader(http.StatusNoContent)
}

// Refuse answers status with WeChat Pay's failure body
// {"code":"FAIL","message":message}; WeChat Pay delivers the callback
// again. A status outside 4xx and 5xx is written as 500, since WeChat Pay
// reads a 200 or 204 as success whatever the body says.
func (v *Verifier) Refuse(w http.ResponseWriter, status int, message string) {
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	body, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"FAIL", message})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
