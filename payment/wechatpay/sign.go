package wechatpay

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"
)

// WeChat Pay's side of a callback, for simulators and tests of a webhook
// that a Verifier guards: the headers it signs a body with, and the
// resource it encrypts. This package's own tests sign and encrypt by their
// own code, so that a misreading of the documentation shared by both
// halves cannot hide.

// Sign returns the headers WeChat Pay sends with a callback's body, as its
// documentation says ("签名验证"): Wechatpay-Timestamp (at, in Unix
// seconds), a fresh Wechatpay-Nonce, Wechatpay-Serial, and
// Wechatpay-Signature, SHA256withRSA (PKCS #1 v1.5) with key over the
// timestamp, the nonce and the body, each followed by "\n".
func Sign(key *rsa.PrivateKey, serial string, at time.Time, body []byte) (http.Header, error) {
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return nil, err
	}
	nonce, timestamp := hex.EncodeToString(n[:]), strconv.FormatInt(at.Unix(), 10)
	digest := sha256.Sum256([]byte(timestamp + "\n" + nonce + "\n" + string(body) + "\n"))
	signature, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set("Wechatpay-Timestamp", timestamp)
	h.Set("Wechatpay-Nonce", nonce)
	h.Set("Wechatpay-Signature", base64.StdEncoding.EncodeToString(signature))
	h.Set("Wechatpay-Serial", serial)
	h.Set("Wechatpay-Signature-Type", "WECHATPAY2-SHA256-RSA2048")
	return h, nil
}

// Encrypt returns a callback's resource object for plaintext (a
// transaction's or a refund's JSON), as WeChat Pay documents it
// ("证书和回调报文解密"): AEAD_AES_256_GCM under the merchant's APIv3 key
// (32 bytes), a fresh 12-byte nonce, originalType ("transaction",
// "refund") as the associated data; the ciphertext with its tag, in
// base64.
func Encrypt(apiV3Key, originalType string, plaintext []byte) (map[string]string, error) {
	block, err := aes.NewCipher([]byte(apiV3Key))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	var n [6]byte
	if _, err := rand.Read(n[:]); err != nil {
		return nil, err
	}
	nonce := hex.EncodeToString(n[:]) // 12 characters, as WeChat Pay's
	return map[string]string{
		"original_type":   originalType,
		"algorithm":       algorithmAEAD,
		"ciphertext":      base64.StdEncoding.EncodeToString(aead.Seal(nil, []byte(nonce), plaintext, []byte(originalType))),
		"associated_data": originalType,
		"nonce":           nonce,
	}, nil
}
