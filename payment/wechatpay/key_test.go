package wechatpay_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment/wechatpay"
)

func TestParsePublicKey_WeChatPayForms_ReadTheKey(t *testing.T) {
	t.Parallel()
	key := platformKey()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	template := &x509.Certificate{
		SerialNumber: new(big.Int).SetBytes([]byte{0x51, 0x57, 0xf0, 0x9e}),
		Subject:      pkix.Name{CommonName: "Tenpay.com Root CA test"},
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Unix(1<<32, 0),
	}
	certificate, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"WeChat Pay public key PEM", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})},
		{"platform certificate PEM", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certificate})},
		{"the test vector's public key", readTestdata(t, "wechatpay_test_public_key.pem")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := wechatpay.ParsePublicKey(tc.in)
			require.NoError(t, err)
			if tc.name != "the test vector's public key" {
				require.True(t, key.PublicKey.Equal(got))
			}
		})
	}
}

func TestParsePublicKey_NotAnRSAPublicKey_IsRefused(t *testing.T) {
	t.Parallel()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ecDER, err := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"bare base64", []byte("MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA")},
		{"the merchant's private key", readTestdata(t, "wechatpay_test_private_key.pem")},
		{"an EC key", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})},
		{"a broken certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := wechatpay.ParsePublicKey(tc.in)
			require.Error(t, err)
		})
	}
}
