package alipay

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
)

// ParsePublicKey reads Alipay's public key (支付宝公钥) in any of the forms
// Alipay hands it out:
//
//   - a PEM block "PUBLIC KEY" (PKIX, SubjectPublicKeyInfo);
//   - the bare base64 of the same DER, one line, as the open platform's
//     console shows it ("MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA...");
//     whitespace and line breaks in it are ignored;
//   - a PEM block "CERTIFICATE", the Alipay public key certificate
//     (alipayCertPublicKey_RSA2.crt) of the certificate mode: its public key
//     is taken. The certificate's chain is not verified: it is configuration
//     the merchant downloaded, not something a callback presents.
//
// The key must be RSA.
func ParsePublicKey(data []byte) (*rsa.PublicKey, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("alipay: ParsePublicKey: empty key; paste Alipay's public key (PEM or the console's base64)")
	}
	var der []byte
	certificate := false
	if block, _ := pem.Decode(data); block != nil {
		switch block.Type {
		case "PUBLIC KEY":
		case "CERTIFICATE":
			certificate = true
		default:
			return nil, fmt.Errorf("alipay: ParsePublicKey: PEM block %q; want PUBLIC KEY or CERTIFICATE (Alipay's public key, not the app's private key)", block.Type)
		}
		der = block.Bytes
	} else {
		compact := bytes.Join(bytes.Fields(data), nil)
		der = make([]byte, base64.StdEncoding.DecodedLen(len(compact)))
		n, err := base64.StdEncoding.Decode(der, compact)
		if err != nil {
			return nil, fmt.Errorf("alipay: ParsePublicKey: neither PEM nor base64: %w", err)
		}
		der = der[:n]
	}
	var key any
	if certificate {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("alipay: ParsePublicKey: %w", err)
		}
		key = cert.PublicKey
	} else {
		var err error
		if key, err = x509.ParsePKIXPublicKey(der); err != nil {
			return nil, fmt.Errorf("alipay: ParsePublicKey: %w", err)
		}
	}
	rsaKey, ok := key.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("alipay: ParsePublicKey: a %T key; RSA2 needs an RSA key", key)
	}
	return rsaKey, nil
}
