package alipay

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/orderguard/idempotency/payment"
)

// signTypeRSA2 is the only sign_type accepted: SHA256withRSA.
const signTypeRSA2 = "RSA2"

// verifySignature reads the form body and checks its sign, as Alipay
// documents the verification of an asynchronous notification (see the
// package doc). It returns the parameters, one value each, only when the
// signature verifies; every failure is payment.ErrSignature, since nothing
// of an unverified body is read.
func verifySignature(key *rsa.PublicKey, body []byte) (map[string]string, error) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("alipay: body is not a form: %v: %w", err, payment.ErrSignature)
	}
	params := make(map[string]string, len(form))
	for name, values := range form {
		// Alipay sends each parameter once; with two values the signed
		// content would be a guess.
		if len(values) != 1 {
			return nil, fmt.Errorf("alipay: parameter %q is sent %d times: %w", name, len(values), payment.ErrSignature)
		}
		params[name] = values[0]
	}
	signType, ok := params["sign_type"]
	if !ok {
		return nil, fmt.Errorf("alipay: no sign_type: %w", payment.ErrSignature)
	}
	if signType != signTypeRSA2 {
		return nil, fmt.Errorf("alipay: sign_type %q; only RSA2 (SHA256withRSA) is accepted, set the app's signing to RSA2: %w", signType, payment.ErrSignature)
	}
	sign, ok := params["sign"]
	if !ok || sign == "" {
		return nil, fmt.Errorf("alipay: no sign: %w", payment.ErrSignature)
	}
	signature, err := base64.StdEncoding.DecodeString(sign)
	if err != nil {
		return nil, fmt.Errorf("alipay: sign is not base64: %w", payment.ErrSignature)
	}
	digest := sha256.Sum256([]byte(signedContent(params)))
	if err := rsa.VerifyPKCS1v15(key, crypto.SHA256, digest[:], signature); err != nil {
		return nil, fmt.Errorf("alipay: sign does not verify with Alipay's public key: %w", payment.ErrSignature)
	}
	return params, nil
}

// signedContent is the string Alipay signs: every parameter but sign and
// sign_type, empty values included, sorted by name, name=value joined by
// '&', values decoded.
func signedContent(params map[string]string) string {
	names := make([]string, 0, len(params))
	for name := range params {
		if name == "sign" || name == "sign_type" {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(name)
		b.WriteByte('=')
		b.WriteString(params[name])
	}
	return b.String()
}
