package main

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// Alipay's asynchronous notification, signed as its documentation says
// ("自行实现验签", the rules payment/alipay verifies): a form body whose
// parameters but sign and sign_type, sorted by name and joined
// name=value with '&', are signed SHA256withRSA (RSA2) with the key whose
// public half the merchant holds as Alipay's public key; sign is standard
// base64.

// alipayKey is what Alipay signs with (the private half of the server's
// -alipay-public-key) and the merchant its notifications are for: the
// app (the server's -alipay-app-id) and the seller (-alipay-seller-id).
type alipayKey struct {
	private         *rsa.PrivateKey
	appID, sellerID string
}

// The app and the seller the simulated notifications are for, by default.
const (
	defaultAlipayAppID    = "2021000000000001"
	defaultAlipaySellerID = "2088000000000001"
)

// alipayBody is a notification of trade_status_sync for key's merchant,
// unsigned: a payment's TRADE_SUCCESS, or a refund's, which Alipay tells
// with refund_fee, the trade's refunded amount so far.
func alipayBody(key alipayKey, ev event) []byte {
	v := url.Values{}
	v.Set("notify_time", ev.At.In(chinaTime).Format(time.DateTime))
	v.Set("notify_type", "trade_status_sync")
	v.Set("notify_id", ev.ID)
	v.Set("app_id", key.appID)
	v.Set("auth_app_id", key.appID)
	if key.sellerID != "" {
		v.Set("seller_id", key.sellerID)
	}
	v.Set("charset", "utf-8")
	v.Set("version", "1.0")
	v.Set("trade_no", ev.PaymentID)
	v.Set("out_trade_no", ev.OrderNo)
	v.Set("trade_status", "TRADE_SUCCESS")
	v.Set("total_amount", yuan(ev.Total))
	v.Set("gmt_payment", ev.At.In(chinaTime).Format(time.DateTime))
	if ev.Kind == kindRefund {
		v.Set("refund_fee", yuan(ev.Refunded))
		v.Set("out_biz_no", ev.RefundID)
		v.Set("gmt_refund", ev.At.In(chinaTime).Format("2006-01-02 15:04:05.000"))
	}
	return []byte(v.Encode())
}

var chinaTime = time.FixedZone("CST", 8*3600)

func yuan(fen int64) string { return fmt.Sprintf("%d.%02d", fen/100, fen%100) }

// alipaySign appends sign_type and sign to the form.
func alipaySign(key any, _ event, body []byte, _ time.Time) (http.Header, []byte, error) {
	v, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, nil, err
	}
	sign, err := alipaySignature(key.(alipayKey).private, v)
	if err != nil {
		return nil, nil, err
	}
	v.Set("sign_type", "RSA2")
	v.Set("sign", sign)
	return http.Header{}, []byte(v.Encode()), nil
}

func alipaySignature(key *rsa.PrivateKey, v url.Values) (string, error) {
	names := make([]string, 0, len(v))
	for name := range v {
		if name != "sign" && name != "sign_type" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = name + "=" + v.Get(name)
	}
	digest := sha256.Sum256([]byte(strings.Join(parts, "&")))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// alipayTamper sends unsigned's parameters with the sign of signed.
func alipayTamper(h http.Header, signed, unsigned []byte) (http.Header, []byte) {
	s, _ := url.ParseQuery(string(signed))
	v, _ := url.ParseQuery(string(unsigned))
	v.Set("sign_type", "RSA2")
	v.Set("sign", s.Get("sign"))
	return h, []byte(v.Encode())
}

// alipayAcked: Alipay stops only on the body "success".
func alipayAcked(status int, body []byte) bool {
	return status == http.StatusOK && strings.TrimSpace(string(body)) == "success"
}

// readRSAKey reads the private key whose public half the server holds as
// the provider's public key (Alipay's, WeChat Pay's): PEM, PKCS #8 or
// PKCS #1.
func readRSAKey(path string) (*rsa.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: not PEM", path)
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New(path + ": not an RSA key")
	}
	return rk, nil
}
