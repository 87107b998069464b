package alipay_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment/alipay"
)

func parsePrivateKey(t *testing.T, data []byte) *rsa.PrivateKey {
	t.Helper()
	block, _ := pem.Decode(data)
	require.NotNil(t, block)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	return key.(*rsa.PrivateKey)
}

func TestParsePublicKey_AlipayForms_ReadTheKey(t *testing.T) {
	t.Parallel()
	want := parsePrivateKey(t, readTestdata(t, "alipay_test_private_key.pem")).PublicKey
	bare := string(readTestdata(t, "alipay_test_public_key.txt"))

	var wrapped strings.Builder
	for i := 0; i < len(bare); i += 64 {
		wrapped.WriteString(bare[i:min(i+64, len(bare))] + "\r\n")
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "Alipay test"},
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Unix(1<<32, 0),
	}
	signer := parsePrivateKey(t, readTestdata(t, "alipay_test_private_key.pem"))
	der, err := x509.CreateCertificate(rand.Reader, template, template, &want, signer)
	require.NoError(t, err)
	certificate := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	for _, tc := range []struct {
		name string
		in   string
	}{
		{"PKIX PEM", string(readTestdata(t, "alipay_test_public_key.pem"))},
		{"bare base64 as the console shows it", bare},
		{"bare base64 wrapped and padded with spaces", "  \n" + wrapped.String() + "\n"},
		{"public key certificate PEM", string(certificate)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := alipay.ParsePublicKey([]byte(tc.in))
			require.NoError(t, err)
			require.True(t, want.Equal(got))
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
		in   string
	}{
		{"empty", ""},
		{"the private key PEM", string(readTestdata(t, "alipay_test_private_key.pem"))},
		{"not base64", "MIIB*not*base64"},
		{"base64 of no key", "aGVsbG8gd29ybGQ="},
		{"an EC key", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER}))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := alipay.ParsePublicKey([]byte(tc.in))
			require.Error(t, err)
		})
	}
}
