package wechatpay_test

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

const (
	serial   = "PUB_KEY_ID_0114232134912410000000000000"
	apiV3Key = "an APIv3 key, exactly 32 bytes.."
)

// platformKey is WeChat Pay's key pair in these tests (one per run: RSA
// keygen is slow).
var platformKey = sync.OnceValue(func() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
})

var otherKey = sync.OnceValue(func() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
})

var now = time.Date(2024, 6, 11, 22, 34, 5, 0, time.FixedZone("CST", 8*3600))

type testBundle struct {
	key      *rsa.PrivateKey
	verifier *wechatpay.Verifier
}

func setup(t *testing.T, cfg wechatpay.Config) *testBundle {
	t.Helper()
	key := platformKey()
	if cfg.PlatformKeys == nil {
		cfg.PlatformKeys = map[string]*rsa.PublicKey{serial: &key.PublicKey}
	}
	if cfg.APIv3Key == "" {
		cfg.APIv3Key = apiV3Key
	}
	v, err := wechatpay.New(cfg)
	require.NoError(t, err)
	return &testBundle{key: key, verifier: v}
}

// signWechatPay signs a callback as WeChat Pay documents its signature
// ("签名验证"): the message is the timestamp, the nonce and the body, each
// followed by "\n"; it is signed with SHA256withRSA by the platform's
// private key, and the signature goes in Wechatpay-Signature as base64.
func signWechatPay(t *testing.T, key *rsa.PrivateKey, timestamp, nonce string, body []byte) http.Header {
	t.Helper()
	message := timestamp + "\n" + nonce + "\n" + string(body) + "\n"
	digest := sha256.Sum256([]byte(message))
	signature, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	require.NoError(t, err)
	header := http.Header{}
	header.Set("Wechatpay-Timestamp", timestamp)
	header.Set("Wechatpay-Nonce", nonce)
	header.Set("Wechatpay-Signature", base64.StdEncoding.EncodeToString(signature))
	header.Set("Wechatpay-Serial", serial)
	header.Set("Wechatpay-Signature-Type", "WECHATPAY2-SHA256-RSA2048")
	return header
}

// resource encrypts plaintext as WeChat Pay documents ("证书和回调报文解密"):
// AEAD_AES_256_GCM, the APIv3 key as the key, a 12-byte nonce string, the
// associated data; the ciphertext with its 16-byte tag, in base64.
func resource(t *testing.T, key, nonce, associatedData, originalType string, plaintext []byte) map[string]string {
	t.Helper()
	block, err := aes.NewCipher([]byte(key))
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	sealed := aead.Seal(nil, []byte(nonce), plaintext, []byte(associatedData))
	return map[string]string{
		"original_type":   originalType,
		"algorithm":       "AEAD_AES_256_GCM",
		"ciphertext":      base64.StdEncoding.EncodeToString(sealed),
		"associated_data": associatedData,
		"nonce":           nonce,
	}
}

// callback is one notification to build: its envelope, resource and
// headers, each changeable by a test.
type callback struct {
	id, eventType, createTime string
	plaintext                 []byte
	key, nonce, ad            string // the resource's encryption
	timestamp                 time.Time
	headerNonce               string
	resource                  func(map[string]string)
	envelope                  func(map[string]any)
	raw                       []byte // the body, instead of the envelope
}

func newCallback(eventType string, plaintext any) *callback {
	data, err := json.Marshal(plaintext)
	if err != nil {
		panic(err)
	}
	return &callback{
		id:          "EV-2018022511223320873",
		eventType:   eventType,
		createTime:  "2024-06-11T22:34:03+08:00",
		plaintext:   data,
		key:         apiV3Key,
		nonce:       "fdasflkja484",
		ad:          "transaction",
		timestamp:   now,
		headerNonce: "5K8264ILTKCH16CQ2502SI8ZNMTM67VS",
	}
}

func (c *callback) body(t *testing.T) []byte {
	t.Helper()
	if c.raw != nil {
		return c.raw
	}
	res := resource(t, c.key, c.nonce, c.ad, "transaction", c.plaintext)
	if c.resource != nil {
		c.resource(res)
	}
	env := map[string]any{
		"id":            c.id,
		"create_time":   c.createTime,
		"resource_type": "encrypt-resource",
		"event_type":    c.eventType,
		"summary":       "支付成功",
		"resource":      res,
	}
	if c.envelope != nil {
		c.envelope(env)
	}
	body, err := json.Marshal(env)
	require.NoError(t, err)
	return body
}

// signed returns the callback's headers and body, signed by key.
func (c *callback) signed(t *testing.T, key *rsa.PrivateKey) (http.Header, []byte) {
	t.Helper()
	body := c.body(t)
	return signWechatPay(t, key, strconv.FormatInt(c.timestamp.Unix(), 10), c.headerNonce, body), body
}

func transactionSuccess() map[string]any {
	return map[string]any{
		"mchid":            "1900000109",
		"appid":            "wxd678efh567hg6787",
		"out_trade_no":     "ORDER-0001",
		"transaction_id":   "4200002345202406111234567890",
		"trade_type":       "JSAPI",
		"trade_state":      "SUCCESS",
		"trade_state_desc": "支付成功",
		"bank_type":        "OTHERS",
		"success_time":     "2024-06-11T22:33:59+08:00",
		"payer":            map[string]any{"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
		"amount":           map[string]any{"total": 1234, "payer_total": 1200, "currency": "CNY", "payer_currency": "CNY"},
	}
}

func refundSuccess() map[string]any {
	return map[string]any{
		"mchid":                 "1900000109",
		"out_trade_no":          "ORDER-0001",
		"transaction_id":        "4200002345202406111234567890",
		"out_refund_no":         "REFUND-0001",
		"refund_id":             "50000000382019052709732678859",
		"refund_status":         "SUCCESS",
		"success_time":          "2024-06-12T10:00:00+08:00",
		"user_received_account": "招商银行信用卡0403",
		"amount":                map[string]any{"total": 1234, "refund": 300, "payer_total": 1234, "payer_refund": 300},
	}
}

func with(m map[string]any, path string, value any) map[string]any {
	parts := strings.Split(path, ".")
	at := m
	for _, p := range parts[:len(parts)-1] {
		at = at[p].(map[string]any)
	}
	if value == nil {
		delete(at, parts[len(parts)-1])
	} else {
		at[parts[len(parts)-1]] = value
	}
	return m
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return data
}

func TestVerify_KnownAnswer_PinsMessageSignatureAndResource(t *testing.T) {
	t.Parallel()
	body := readTestdata(t, "notify_transaction_success.json")
	plaintext := readTestdata(t, "notify_transaction_success.plaintext.json")
	message := readTestdata(t, "notify_transaction_success.message")
	key, err := wechatpay.ParsePublicKey(readTestdata(t, "wechatpay_test_public_key.pem"))
	require.NoError(t, err)

	canonical, lower := http.Header{}, http.Header{}
	for _, line := range strings.Split(strings.TrimSpace(string(readTestdata(t, "notify_transaction_success.headers"))), "\n") {
		name, value, ok := strings.Cut(line, ": ")
		require.True(t, ok)
		canonical.Set(name, value)
		lower[strings.ToLower(name)] = []string{value}
	}
	timestamp := canonical.Get("Wechatpay-Timestamp")
	require.Equal(t, timestamp+"\n"+canonical.Get("Wechatpay-Nonce")+"\n"+string(body)+"\n", string(message),
		"the message openssl signed is the documented one")

	v, err := wechatpay.New(wechatpay.Config{
		PlatformKeys: map[string]*rsa.PublicKey{canonical.Get("Wechatpay-Serial"): key},
		APIv3Key:     strings.TrimSpace(string(readTestdata(t, "apiv3_key.txt"))),
	})
	require.NoError(t, err)
	seconds, err := strconv.ParseInt(timestamp, 10, 64)
	require.NoError(t, err)
	at := time.Unix(seconds+30, 0)

	for name, header := range map[string]http.Header{"canonical header keys": canonical, "lower-case header keys": lower} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ev, err := v.Verify(header, body, at)
			require.NoError(t, err)
			require.Equal(t, payment.Event{
				Provider:  "wechatpay",
				ID:        "EV-2018022511223320873",
				Type:      "TRANSACTION.SUCCESS",
				Kind:      payment.Succeeded,
				OrderNo:   "ORDER-20240611-0001",
				PaymentID: "4200002345202406111234567890",
				Amount:    8888,
				Currency:  "CNY",
				Digest:    sha256Hex(plaintext),
			}, ev)
		})
	}
}

func TestVerify_SignedCallback_ReadsEventByType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		eventType string
		plaintext map[string]any
		want      payment.Event
	}{
		{"TRANSACTION.SUCCESS is Succeeded with amount.total", "TRANSACTION.SUCCESS", transactionSuccess(), payment.Event{
			Kind: payment.Succeeded, OrderNo: "ORDER-0001", PaymentID: "4200002345202406111234567890", Amount: 1234, Currency: "CNY",
		}},
		{"TRANSACTION.SUCCESS in another currency keeps it", "TRANSACTION.SUCCESS", with(transactionSuccess(), "amount.currency", "HKD"), payment.Event{
			Kind: payment.Succeeded, OrderNo: "ORDER-0001", PaymentID: "4200002345202406111234567890", Amount: 1234, Currency: "HKD",
		}},
		{"REFUND.SUCCESS is Refunded with this refund's amount", "REFUND.SUCCESS", refundSuccess(), payment.Event{
			Kind: payment.Refunded, OrderNo: "ORDER-0001", PaymentID: "4200002345202406111234567890",
			RefundID: "50000000382019052709732678859", Amount: 300, Currency: "CNY",
		}},
		{"REFUND.ABNORMAL is Ignored", "REFUND.ABNORMAL", with(refundSuccess(), "refund_status", "ABNORMAL"), payment.Event{Kind: payment.Ignored}},
		{"REFUND.CLOSED is Ignored", "REFUND.CLOSED", with(refundSuccess(), "refund_status", "CLOSED"), payment.Event{Kind: payment.Ignored}},
		{"another TRANSACTION type is Ignored", "TRANSACTION.CLOSED", with(transactionSuccess(), "trade_state", "CLOSED"), payment.Event{Kind: payment.Ignored}},
		{"an unknown event type is Ignored", "MCHTRANSFER.BILL.FINISHED", map[string]any{"state": "SUCCESS"}, payment.Event{Kind: payment.Ignored}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, wechatpay.Config{})
			c := newCallback(tc.eventType, tc.plaintext)
			header, body := c.signed(t, b.key)

			ev, err := b.verifier.Verify(header, body, now)
			require.NoError(t, err)
			want := tc.want
			want.Provider = "wechatpay"
			want.ID = c.id
			want.Type = tc.eventType
			want.Digest = sha256Hex(c.plaintext)
			require.Equal(t, want, ev)
		})
	}
}

func TestVerify_RedeliveryInANewEnvelope_HasTheSameDigest(t *testing.T) {
	t.Parallel()
	b := setup(t, wechatpay.Config{})
	first := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
	again := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
	again.createTime = "2024-06-11T22:38:03+08:00"
	again.nonce = "0123456789ab"
	again.headerNonce = "ANOTHERNONCE"
	again.timestamp = now.Add(4 * time.Minute)

	h1, b1 := first.signed(t, b.key)
	h2, b2 := again.signed(t, b.key)
	ev1, err := b.verifier.Verify(h1, b1, now)
	require.NoError(t, err)
	ev2, err := b.verifier.Verify(h2, b2, now.Add(4*time.Minute))
	require.NoError(t, err)
	require.NotEqual(t, b1, b2)
	require.Equal(t, ev1, ev2)
}

func TestVerify_NotSignedByWeChatPay_IsErrSignature(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, header http.Header, body []byte) (http.Header, []byte)
	}{
		{"a byte of the body changed", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			changed := append([]byte(nil), body...)
			i := strings.Index(string(changed), "EV-")
			changed[i] = 'F'
			return h, changed
		}},
		{"a space appended to the body", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			return h, append(append([]byte(nil), body...), ' ')
		}},
		{"the timestamp header changed", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Timestamp", strconv.FormatInt(now.Unix()+1, 10))
			return h, body
		}},
		{"the nonce header changed", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Nonce", "another")
			return h, body
		}},
		{"signed with another key under the known serial", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			other := signWechatPay(t, otherKey(), h.Get("Wechatpay-Timestamp"), h.Get("Wechatpay-Nonce"), body)
			return other, body
		}},
		{"an unknown serial", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Serial", "5157F09EFDC096DE15EBE81A47057A7232F1B8E1")
			return h, body
		}},
		{"the signature not base64", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Signature", "not*base64")
			return h, body
		}},
		{"WeChat Pay's signature probe", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Signature", "WECHATPAY/SIGNTEST/"+h.Get("Wechatpay-Signature"))
			return h, body
		}},
		{"another signature type", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Signature-Type", "WECHATPAY2-SM2-WITH-SM3")
			return h, body
		}},
		{"a header sent twice", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Add("Wechatpay-Nonce", h.Get("Wechatpay-Nonce"))
			return h, body
		}},
		{"Wechatpay-Timestamp missing", deleteHeader("Wechatpay-Timestamp")},
		{"Wechatpay-Nonce missing", deleteHeader("Wechatpay-Nonce")},
		{"Wechatpay-Signature missing", deleteHeader("Wechatpay-Signature")},
		{"Wechatpay-Serial missing", deleteHeader("Wechatpay-Serial")},
		{"Wechatpay-Signature empty", func(t *testing.T, h http.Header, body []byte) (http.Header, []byte) {
			h.Set("Wechatpay-Signature", "")
			return h, body
		}},
		{"no headers, junk body", func(t *testing.T, _ http.Header, _ []byte) (http.Header, []byte) {
			return http.Header{}, []byte("not json")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, wechatpay.Config{})
			header, body := newCallback("TRANSACTION.SUCCESS", transactionSuccess()).signed(t, b.key)
			header, body = tc.mutate(t, header, body)

			_, err := b.verifier.Verify(header, body, now)
			require.ErrorIs(t, err, payment.ErrSignature)
		})
	}
}

func deleteHeader(name string) func(*testing.T, http.Header, []byte) (http.Header, []byte) {
	return func(_ *testing.T, h http.Header, body []byte) (http.Header, []byte) {
		h.Del(name)
		return h, body
	}
}

func TestVerify_SerialOfAnotherConfiguredKey_IsErrSignature(t *testing.T) {
	t.Parallel()
	b := setup(t, wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{
		serial:       &platformKey().PublicKey,
		"OLD-SERIAL": &otherKey().PublicKey,
	}})
	header, body := newCallback("TRANSACTION.SUCCESS", transactionSuccess()).signed(t, b.key)
	header.Set("Wechatpay-Serial", "OLD-SERIAL")

	_, err := b.verifier.Verify(header, body, now)
	require.ErrorIs(t, err, payment.ErrSignature)
}

func TestVerify_SerialInAnotherCase_IsMatched(t *testing.T) {
	t.Parallel()
	b := setup(t, wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{
		"5157f09efdc096de15ebe81a47057a7232f1b8e1": &platformKey().PublicKey,
	}})
	header, body := newCallback("TRANSACTION.SUCCESS", transactionSuccess()).signed(t, b.key)
	header.Set("Wechatpay-Serial", "5157F09EFDC096DE15EBE81A47057A7232F1B8E1")

	_, err := b.verifier.Verify(header, body, now)
	require.NoError(t, err)
}

func TestVerify_TimestampAgainstTolerance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		tolerance time.Duration
		skew      time.Duration
		want      error
	}{
		{"6 minutes old is ErrStale", 0, -6 * time.Minute, payment.ErrStale},
		{"6 minutes ahead is ErrStale", 0, 6 * time.Minute, payment.ErrStale},
		{"4 minutes old is accepted", 0, -4 * time.Minute, nil},
		{"4 minutes ahead is accepted", 0, 4 * time.Minute, nil},
		{"exactly the tolerance is accepted", 0, -payment.DefaultTolerance, nil},
		{"a configured tolerance applies", time.Minute, -2 * time.Minute, payment.ErrStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, wechatpay.Config{Tolerance: tc.tolerance})
			c := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
			c.timestamp = now.Add(tc.skew)
			header, body := c.signed(t, b.key)

			_, err := b.verifier.Verify(header, body, now)
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
		})
	}
}

func TestVerify_StaleAndUnsigned_IsErrSignatureFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, wechatpay.Config{})
	c := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
	c.timestamp = now.Add(-time.Hour)
	header, body := c.signed(t, otherKey())

	_, err := b.verifier.Verify(header, body, now)
	require.ErrorIs(t, err, payment.ErrSignature)
	require.NotErrorIs(t, err, payment.ErrStale)
}

func TestVerify_ResourceNotDecryptedWithTheAPIv3Key_IsErrDecrypt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*callback)
	}{
		{"encrypted with another APIv3 key", func(c *callback) { c.key = "another APIv3 key of 32 bytes..." }},
		{"associated_data changed", func(c *callback) {
			c.resource = func(r map[string]string) { r["associated_data"] = "refund" }
		}},
		{"nonce changed", func(c *callback) {
			c.resource = func(r map[string]string) { r["nonce"] = "fdasflkja485" }
		}},
		{"ciphertext's tag cut", func(c *callback) {
			c.resource = func(r map[string]string) {
				sealed, _ := base64.StdEncoding.DecodeString(r["ciphertext"])
				r["ciphertext"] = base64.StdEncoding.EncodeToString(sealed[:len(sealed)-1])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, wechatpay.Config{})
			c := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
			tc.change(c)
			header, body := c.signed(t, b.key)

			_, err := b.verifier.Verify(header, body, now)
			require.ErrorIs(t, err, wechatpay.ErrDecrypt)
			require.ErrorIs(t, err, payment.ErrSignature)
		})
	}
}

func TestVerify_SignedButUnreadable_IsErrMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*callback)
	}{
		{"body not JSON", func(c *callback) { c.raw = []byte("not json") }},
		{"no id", func(c *callback) { c.id = "" }},
		{"no event_type", func(c *callback) { c.eventType = "" }},
		{"no resource", func(c *callback) { c.envelope = func(m map[string]any) { delete(m, "resource") } }},
		{"another algorithm", func(c *callback) { c.resource = func(r map[string]string) { r["algorithm"] = "AEAD_SM4_GCM" } }},
		{"a nonce not of 12 bytes", func(c *callback) { c.resource = func(r map[string]string) { r["nonce"] = "0123456789abcdef" } }},
		{"ciphertext not base64", func(c *callback) { c.resource = func(r map[string]string) { r["ciphertext"] = "***" } }},
		{"plaintext not JSON", func(c *callback) { c.plaintext = []byte("not json") }},
		{"TRANSACTION.SUCCESS whose trade_state is NOTPAY", func(c *callback) {
			c.plaintext = marshal(with(transactionSuccess(), "trade_state", "NOTPAY"))
		}},
		{"no amount.total", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "amount.total", nil)) }},
		{"amount.total not whole fen", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "amount.total", 12.5)) }},
		{"amount.total a string", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "amount.total", "1234")) }},
		{"amount.total negative", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "amount.total", -1)) }},
		{"no amount.currency", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "amount.currency", nil)) }},
		{"no out_trade_no", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "out_trade_no", nil)) }},
		{"no transaction_id", func(c *callback) { c.plaintext = marshal(with(transactionSuccess(), "transaction_id", nil)) }},
		{"REFUND.SUCCESS without refund_id", func(c *callback) {
			c.eventType = "REFUND.SUCCESS"
			c.plaintext = marshal(with(refundSuccess(), "refund_id", nil))
		}},
		{"REFUND.SUCCESS whose refund_status is PROCESSING", func(c *callback) {
			c.eventType = "REFUND.SUCCESS"
			c.plaintext = marshal(with(refundSuccess(), "refund_status", "PROCESSING"))
		}},
		{"REFUND.SUCCESS without amount.refund", func(c *callback) {
			c.eventType = "REFUND.SUCCESS"
			c.plaintext = marshal(with(refundSuccess(), "amount.refund", nil))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, wechatpay.Config{})
			c := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
			tc.change(c)
			header, body := c.signed(t, b.key)

			_, err := b.verifier.Verify(header, body, now)
			require.ErrorIs(t, err, payment.ErrMalformed)
			require.NotErrorIs(t, err, payment.ErrSignature)
		})
	}
}

func TestVerify_SignedTimestampNotUnixSeconds_IsErrMalformed(t *testing.T) {
	t.Parallel()
	b := setup(t, wechatpay.Config{})
	body := newCallback("TRANSACTION.SUCCESS", transactionSuccess()).body(t)
	for _, timestamp := range []string{"+1718116445", "1718116445.0", "2024-06-11T22:34:05+08:00", "99999999999999999999"} {
		header := signWechatPay(t, b.key, timestamp, "nonce", body)
		_, err := b.verifier.Verify(header, body, now)
		require.ErrorIs(t, err, payment.ErrMalformed, timestamp)
	}
}

func marshal(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

func TestVerify_BodyOverTheLimit_IsErrTooLarge(t *testing.T) {
	t.Parallel()
	t.Run("configured limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, wechatpay.Config{MaxBodyBytes: 100})
		header, body := newCallback("TRANSACTION.SUCCESS", transactionSuccess()).signed(t, b.key)
		_, err := b.verifier.Verify(header, body, now)
		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
	t.Run("default limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, wechatpay.Config{})
		c := newCallback("TRANSACTION.SUCCESS", transactionSuccess())
		c.envelope = func(m map[string]any) { m["summary"] = strings.Repeat("x", payment.MaxBodyBytes) }
		header, body := c.signed(t, b.key)
		_, err := b.verifier.Verify(header, body, now)
		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
}

func TestNew_InvalidConfig_IsRefused(t *testing.T) {
	t.Parallel()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	keys := map[string]*rsa.PublicKey{serial: &platformKey().PublicKey}
	for _, tc := range []struct {
		name string
		cfg  wechatpay.Config
	}{
		{"no platform keys", wechatpay.Config{APIv3Key: apiV3Key}},
		{"a nil platform key", wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{serial: nil}, APIv3Key: apiV3Key}},
		{"an empty serial", wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{"": &platformKey().PublicKey}, APIv3Key: apiV3Key}},
		{"a serial twice in different cases", wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{"ab": &platformKey().PublicKey, "AB": &otherKey().PublicKey}, APIv3Key: apiV3Key}},
		{"a key under 2048 bits", wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{serial: &small.PublicKey}, APIv3Key: apiV3Key}},
		{"no APIv3 key", wechatpay.Config{PlatformKeys: keys}},
		{"an APIv3 key of 31 bytes", wechatpay.Config{PlatformKeys: keys, APIv3Key: apiV3Key[:31]}},
		{"a negative tolerance", wechatpay.Config{PlatformKeys: keys, APIv3Key: apiV3Key, Tolerance: -time.Second}},
		{"a negative body limit", wechatpay.Config{PlatformKeys: keys, APIv3Key: apiV3Key, MaxBodyBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := wechatpay.New(tc.cfg)
			require.Error(t, err)
		})
	}
}

func TestAcknowledge_Answers204WithNoBody(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	setup(t, wechatpay.Config{}).verifier.Acknowledge(rec)
	require.Equal(t, http.StatusNoContent, rec.Code)
	require.Empty(t, rec.Body.String())
}

func TestRefuse_AnswersFailJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status, want int
	}{
		{http.StatusUnauthorized, http.StatusUnauthorized},
		{http.StatusInternalServerError, http.StatusInternalServerError},
		{http.StatusOK, http.StatusInternalServerError},
		{http.StatusNoContent, http.StatusInternalServerError},
	} {
		rec := httptest.NewRecorder()
		setup(t, wechatpay.Config{}).verifier.Refuse(rec, tc.status, `签名 "错误"`)
		require.Equal(t, tc.want, rec.Code)
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		require.JSONEq(t, `{"code":"FAIL","message":"签名 \"错误\""}`, rec.Body.String())
	}
}

func TestProvider_IsWechatpay(t *testing.T) {
	t.Parallel()
	require.Equal(t, "wechatpay", setup(t, wechatpay.Config{}).verifier.Provider())
}
