package wechatpay

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ParsePublicKey reads a key that verifies WeChat Pay's callbacks:
//
//   - a PEM block "PUBLIC KEY" (PKIX): the WeChat Pay public key
//     (微信支付公钥, pub_key.pem), whose id "PUB_KEY_ID_…" is its serial;
//   - a PEM block "CERTIFICATE": a WeChat Pay platform certificate
//     (平台证书), whose public key is taken. Its serial is the certificate's
//     serial number in hex. The certificate's chain and validity are not
//     checked here: it is configuration the merchant downloaded through the
//     certificate API, which verifies it, not something a callback
//     presents.
//
// The key must be RSA.
func ParsePublicKey(data []byte) (*rsa.PublicKey, error) {
	block, _ := pem.Decode(bytes.TrimSpace(data))
	if block == nil {
		return nil, errors.New("wechatpay: ParsePublicKey: no PEM block; pass the WeChat Pay public key (pub_key.pem) or a platform certificate")
	}
	var key any
	switch block.Type {
	case "PUBLIC KEY":
		var err error
		if key, err = x509.ParsePKIXPublicKey(block.Bytes); err != nil {
			return nil, fmt.Errorf("wechatpay: ParsePublicKey: %w", err)
		}
	case "CERTIFICATE":
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("wechatpay: ParsePublicKey: %w", err)
		}
		key = cert.PublicKey
	default:
		return nil, fmt.Errorf("wechatpay: ParsePublicKey: PEM block %q; want PUBLIC KEY or CERTIFICATE (WeChat Pay's key, not the merchant's private key)", block.Type)
	}
	rsaKey, ok := key.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("wechatpay: ParsePublicKey: a %T key; WECHATPAY2-SHA256-RSA2048 needs an RSA key", key)
	}
	return rsaKey, nil
}
