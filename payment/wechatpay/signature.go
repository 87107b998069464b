package wechatpay

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/orderguard/idempotency/payment"
)

// The callback's signature headers.
const (
	headerTimestamp     = "Wechatpay-Timestamp"
	headerNonce         = "Wechatpay-Nonce"
	headerSignature     = "Wechatpay-Signature"
	headerSerial        = "Wechatpay-Serial"
	headerSignatureType = "Wechatpay-Signature-Type"
)

// signatureTypeRSA is the only Wechatpay-Signature-Type accepted.
const signatureTypeRSA = "WECHATPAY2-SHA256-RSA2048"

// signedHeaders are the signature headers of one callback, as sent.
type signedHeaders struct {
	timestamp, nonce, signature, serial string
}

// readSignedHeaders reads the four signature headers, each once and not
// empty; anything else is payment.ErrSignature.
func readSignedHeaders(header http.Header) (signedHeaders, error) {
	var h signedHeaders
	for _, f := range []struct {
		name string
		into *string
	}{
		{headerTimestamp, &h.timestamp},
		{headerNonce, &h.nonce},
		{headerSignature, &h.signature},
		{headerSerial, &h.serial},
	} {
		values := headerValues(header, f.name)
		if len(values) != 1 || values[0] == "" {
			return signedHeaders{}, fmt.Errorf("wechatpay: header %s sent %d times, want once and not empty: %w", f.name, len(values), payment.ErrSignature)
		}
		*f.into = values[0]
	}
	if values := headerValues(header, headerSignatureType); len(values) > 0 {
		if len(values) != 1 || values[0] != signatureTypeRSA {
			return signedHeaders{}, fmt.Errorf("wechatpay: %s %q; only %s is verified: %w", headerSignatureType, values, signatureTypeRSA, payment.ErrSignature)
		}
	}
	return h, nil
}

// headerValues returns the values of name, matching keys ignoring case, as
// payment.Verifier promises: a header map built by hand or by another
// framework may not hold canonical keys.
func headerValues(header http.Header, name string) []string {
	if values, ok := header[name]; ok {
		return values
	}
	var values []string
	for key, v := range header {
		if strings.EqualFold(key, name) {
			values = append(values, v...)
		}
	}
	return values
}

// verifySignature checks h.signature over the documented message with key.
func verifySignature(key *rsa.PublicKey, h signedHeaders, body []byte) error {
	signature, err := base64.StdEncoding.DecodeString(h.signature)
	if err != nil {
		return fmt.Errorf("wechatpay: %s is not base64: %w", headerSignature, payment.ErrSignature)
	}
	digest := sha256.New()
	digest.Write([]byte(h.timestamp + "\n" + h.nonce + "\n"))
	digest.Write(body)
	digest.Write([]byte("\n"))
	if err := rsa.VerifyPKCS1v15(key, crypto.SHA256, digest.Sum(nil), signature); err != nil {
		return fmt.Errorf("wechatpay: signature does not verify with the key of serial %q: %w", h.serial, payment.ErrSignature)
	}
	return nil
}
