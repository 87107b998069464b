package alipay_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/alipay"
)

// alipayKey is Alipay's key pair in these tests (one per run: RSA keygen
// is slow, and tests need no fresh key but the "wrong key" one).
var alipayKey = sync.OnceValue(func() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
})

// The app and the seller of notification's trades.
const (
	testAppID    = "2021000117650001"
	testSellerID = "2088102119685838"
)

var now = time.Date(2024, 6, 11, 22, 34, 5, 0, time.FixedZone("CST", 8*3600))

type testBundle struct {
	key      *rsa.PrivateKey
	verifier *alipay.Verifier
}

func setup(t *testing.T, cfg alipay.Config) *testBundle {
	t.Helper()
	key := alipayKey()
	if cfg.PublicKey == nil {
		cfg.PublicKey = &key.PublicKey
	}
	if cfg.AppID == "" {
		cfg.AppID = testAppID // notification's
	}
	v, err := alipay.New(cfg)
	require.NoError(t, err)
	return &testBundle{key: key, verifier: v}
}

// signAlipay signs params as Alipay documents the signature of an
// asynchronous notification, and returns the form body Alipay posts:
//
//  1. take every parameter but sign and sign_type (empty values too);
//  2. sort them by name, in ascending ASCII order;
//  3. write each as name=value, with the value not URL-encoded, and join
//     them with '&';
//  4. sign that string's UTF-8 bytes with SHA256withRSA (RSA2) and the
//     private key, and encode the signature in base64;
//  5. post every parameter, sign and sign_type=RSA2 included, form-encoded.
func signAlipay(t *testing.T, params map[string]string, key *rsa.PrivateKey) string {
	t.Helper()
	var names []string
	for name := range params {
		if name != "sign" && name != "sign_type" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	pairs := make([]string, len(names))
	for i, name := range names {
		pairs[i] = name + "=" + params[name]
	}
	digest := sha256.Sum256([]byte(strings.Join(pairs, "&")))
	signature, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	require.NoError(t, err)

	form := url.Values{}
	for name, value := range params {
		form.Set(name, value)
	}
	form.Set("sign", base64.StdEncoding.EncodeToString(signature))
	if _, ok := params["sign_type"]; !ok {
		form.Set("sign_type", "RSA2")
	}
	return form.Encode()
}

// notification is a TRADE_SUCCESS notification, with changes applied
// (an empty string deletes a parameter).
func notification(changes map[string]string) map[string]string {
	params := map[string]string{
		"notify_time":      "2024-06-11 22:34:03",
		"notify_type":      "trade_status_sync",
		"notify_id":        "2024061100222223359012345678",
		"charset":          "utf-8",
		"version":          "1.0",
		"app_id":           "2021000117650001",
		"auth_app_id":      "2021000117650001",
		"trade_no":         "2024061122001404000512345678",
		"out_trade_no":     "ORDER-0001",
		"seller_id":        "2088102119685838",
		"trade_status":     "TRADE_SUCCESS",
		"total_amount":     "12.34",
		"receipt_amount":   "12.34",
		"buyer_pay_amount": "12.34",
		"subject":          "测试订单 a+b=c&d",
		"gmt_create":       "2024-06-11 22:33:46",
		"gmt_payment":      "2024-06-11 22:33:59",
	}
	for name, value := range changes {
		if value == "" {
			delete(params, name)
		} else {
			params[name] = value
		}
	}
	return params
}

// digestOf is the event's digest as the package doc defines it: the
// notification's parameters but sign, sign_type and notify_time, sorted,
// name=value joined by '&'.
func digestOf(body string) string {
	form, err := url.ParseQuery(body)
	if err != nil {
		panic(err)
	}
	var pairs []string
	for name, values := range form {
		if name != "sign" && name != "sign_type" && name != "notify_time" {
			pairs = append(pairs, name+"="+values[0])
		}
	}
	sort.Strings(pairs)
	sum := sha256.Sum256([]byte(strings.Join(pairs, "&")))
	return hex.EncodeToString(sum[:])
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return data
}

func TestVerify_KnownAnswer_PinsSignedContentAndSignature(t *testing.T) {
	t.Parallel()
	form := readTestdata(t, "notify_trade_success.form")
	content := readTestdata(t, "notify_trade_success.content")
	sign := strings.TrimSpace(string(readTestdata(t, "notify_trade_success.sign")))

	t.Run("the signed string is the documented one", func(t *testing.T) {
		t.Parallel()
		// Built by the test's reading of the rule from the posted form;
		// the file was written by hand and signed with openssl.
		values, err := url.ParseQuery(string(form))
		require.NoError(t, err)
		var names []string
		for name := range values {
			if name != "sign" && name != "sign_type" {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		var pairs []string
		for _, name := range names {
			pairs = append(pairs, name+"="+values.Get(name))
		}
		require.Equal(t, string(content), strings.Join(pairs, "&"))
		require.Equal(t, sign, values.Get("sign"))
	})

	t.Run("openssl's signature is the private key's PKCS1v15 SHA-256 signature", func(t *testing.T) {
		t.Parallel()
		block := readTestdata(t, "alipay_test_private_key.pem")
		key := parsePrivateKey(t, block)
		digest := sha256.Sum256(content)
		signature, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, digest[:])
		require.NoError(t, err)
		require.Equal(t, sign, base64.StdEncoding.EncodeToString(signature))
	})

	for _, keyFile := range []string{"alipay_test_public_key.txt", "alipay_test_public_key.pem"} {
		t.Run("verified with "+keyFile, func(t *testing.T) {
			t.Parallel()
			public, err := alipay.ParsePublicKey(readTestdata(t, keyFile))
			require.NoError(t, err)
			v, err := alipay.New(alipay.Config{PublicKey: public, AppID: "2021000117650001"})
			require.NoError(t, err)

			ev, err := v.Verify(http.Header{}, form, now)
			require.NoError(t, err)
			require.Equal(t, payment.Event{
				Provider:  "alipay",
				ID:        "2024061100222223359012345678",
				Scope:     "2021000117650001",
				Type:      "TRADE_SUCCESS",
				Kind:      payment.Succeeded,
				OrderNo:   "ORDER-20240611-0001",
				PaymentID: "2024061122001404000512345678",
				Amount:    8888,
				Currency:  "CNY",
				Digest:    digestOf(string(form)),
			}, ev)
		})
	}
}

func TestVerify_SignedNotification_ReadsEventByTradeStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		changes map[string]string
		kind    payment.Kind
		amount  int64
	}{
		{"TRADE_SUCCESS is Succeeded with total_amount", nil, payment.Succeeded, 1234},
		{"TRADE_FINISHED is Succeeded with total_amount", map[string]string{"trade_status": "TRADE_FINISHED"}, payment.Succeeded, 1234},
		{"TRADE_SUCCESS with refund_fee is Refunded with refund_fee", map[string]string{"refund_fee": "2.00", "gmt_refund": "2024-06-12 10:00:00.123", "out_biz_no": "R1"}, payment.Refunded, 200},
		{"TRADE_CLOSED with refund_fee is Refunded in full", map[string]string{"trade_status": "TRADE_CLOSED", "refund_fee": "12.34", "gmt_refund": "2024-06-12 10:00:00.123", "gmt_close": "2024-06-12 10:00:00"}, payment.Refunded, 1234},
		{"TRADE_FINISHED with refund_fee is Refunded", map[string]string{"trade_status": "TRADE_FINISHED", "refund_fee": "1.00"}, payment.Refunded, 100},
		{"TRADE_CLOSED unpaid is Ignored", map[string]string{"trade_status": "TRADE_CLOSED", "total_amount": "", "gmt_payment": ""}, payment.Ignored, 0},
		{"WAIT_BUYER_PAY is Ignored", map[string]string{"trade_status": "WAIT_BUYER_PAY", "gmt_payment": ""}, payment.Ignored, 0},
		{"trans_currency CNY is read", map[string]string{"trans_currency": "CNY"}, payment.Succeeded, 1234},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, alipay.Config{})
			params := notification(tc.changes)
			body := signAlipay(t, params, b.key)

			ev, err := b.verifier.Verify(http.Header{}, []byte(body), now)
			require.NoError(t, err)
			require.Equal(t, tc.kind, ev.Kind)
			require.Equal(t, tc.amount, ev.Amount)
			require.Equal(t, "alipay", ev.Provider)
			require.Equal(t, params["notify_id"], ev.ID)
			require.Equal(t, params["trade_status"], ev.Type)
			require.Equal(t, "ORDER-0001", ev.OrderNo)
			require.Equal(t, params["trade_no"], ev.PaymentID)
			require.Empty(t, ev.RefundID, "Alipay's refund_fee is cumulative: no refund is named")
			require.Equal(t, digestOf(body), ev.Digest)
			if tc.kind != payment.Ignored {
				require.Equal(t, "CNY", ev.Currency)
			}
		})
	}
}

func TestVerify_RefundNotices_CarryCumulativeRefundedAmount(t *testing.T) {
	t.Parallel()
	b := setup(t, alipay.Config{})
	first := signAlipay(t, notification(map[string]string{
		"notify_id": "N-REFUND-1", "refund_fee": "2.00", "out_biz_no": "REFUND-A", "gmt_refund": "2024-06-12 10:00:00.123",
	}), b.key)
	second := signAlipay(t, notification(map[string]string{
		"notify_id": "N-REFUND-2", "refund_fee": "5.00", "out_biz_no": "REFUND-B", "gmt_refund": "2024-06-13 10:00:00.123",
	}), b.key)

	ev1, err := b.verifier.Verify(http.Header{}, []byte(first), now)
	require.NoError(t, err)
	ev2, err := b.verifier.Verify(http.Header{}, []byte(second), now)
	require.NoError(t, err)

	require.Equal(t, payment.Refunded, ev1.Kind)
	require.Equal(t, int64(200), ev1.Amount)
	require.Equal(t, int64(500), ev2.Amount, "the second notice reports 2.00 + 3.00 refunded so far")
	require.Empty(t, ev1.RefundID)
	require.Empty(t, ev2.RefundID)
}

func TestVerify_RedeliveryHoursLater_IsAcceptedAsTheSameEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, alipay.Config{})
	body := []byte(signAlipay(t, notification(nil), b.key))

	first, err := b.verifier.Verify(http.Header{}, body, now)
	require.NoError(t, err)
	later, err := b.verifier.Verify(http.Header{}, body, now.Add(25*time.Hour))
	require.NoError(t, err, "Alipay redelivers for 25 hours: no tolerance applies")
	require.Equal(t, first, later)
}

func TestVerify_NotSignedByAlipay_IsErrSignature(t *testing.T) {
	t.Parallel()
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		body func(t *testing.T, key *rsa.PrivateKey) string
	}{
		{"a byte of a value changed", func(t *testing.T, key *rsa.PrivateKey) string {
			return strings.Replace(signAlipay(t, notification(nil), key), "total_amount=12.34", "total_amount=92.34", 1)
		}},
		{"a parameter added", func(t *testing.T, key *rsa.PrivateKey) string {
			return signAlipay(t, notification(nil), key) + "&refund_fee=12.34"
		}},
		{"an empty parameter added", func(t *testing.T, key *rsa.PrivateKey) string {
			return signAlipay(t, notification(nil), key) + "&refund_fee="
		}},
		{"a parameter removed", func(t *testing.T, key *rsa.PrivateKey) string {
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Del("seller_id")
			return form.Encode()
		}},
		{"a parameter sent twice", func(t *testing.T, key *rsa.PrivateKey) string {
			return signAlipay(t, notification(nil), key) + "&total_amount=12.34"
		}},
		{"signed with another key", func(t *testing.T, _ *rsa.PrivateKey) string {
			return signAlipay(t, notification(nil), otherKey)
		}},
		{"sign missing", func(t *testing.T, key *rsa.PrivateKey) string {
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Del("sign")
			return form.Encode()
		}},
		{"sign empty", func(t *testing.T, key *rsa.PrivateKey) string {
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Set("sign", "")
			return form.Encode()
		}},
		{"sign not base64", func(t *testing.T, key *rsa.PrivateKey) string {
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Set("sign", "not*base64")
			return form.Encode()
		}},
		{"sign_type RSA", func(t *testing.T, key *rsa.PrivateKey) string {
			return signAlipay(t, notification(map[string]string{"sign_type": "RSA"}), key)
		}},
		{"sign_type lower case", func(t *testing.T, key *rsa.PrivateKey) string {
			return signAlipay(t, notification(map[string]string{"sign_type": "rsa2"}), key)
		}},
		{"sign_type missing", func(t *testing.T, key *rsa.PrivateKey) string {
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Del("sign_type")
			return form.Encode()
		}},
		{"sign of another notification", func(t *testing.T, key *rsa.PrivateKey) string {
			other, err := url.ParseQuery(signAlipay(t, notification(map[string]string{"notify_id": "OTHER"}), key))
			require.NoError(t, err)
			form, err := url.ParseQuery(signAlipay(t, notification(nil), key))
			require.NoError(t, err)
			form.Set("sign", other.Get("sign"))
			return form.Encode()
		}},
		{"not a form", func(t *testing.T, _ *rsa.PrivateKey) string { return "%zz" }},
		{"JSON", func(t *testing.T, _ *rsa.PrivateKey) string { return `{"trade_status":"TRADE_SUCCESS"}` }},
		{"empty body", func(t *testing.T, _ *rsa.PrivateKey) string { return "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, alipay.Config{})
			_, err := b.verifier.Verify(http.Header{}, []byte(tc.body(t, b.key)), now)
			require.ErrorIs(t, err, payment.ErrSignature)
		})
	}
}

func TestVerify_SignedButUnreadable_IsErrMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		changes map[string]string
	}{
		{"total_amount 1.2.3", map[string]string{"total_amount": "1.2.3"}},
		{"total_amount 1e2", map[string]string{"total_amount": "1e2"}},
		{"total_amount -1", map[string]string{"total_amount": "-1"}},
		{"total_amount with three decimals", map[string]string{"total_amount": "1.234"}},
		{"total_amount missing", map[string]string{"total_amount": ""}},
		{"refund_fee not a decimal", map[string]string{"refund_fee": "1,00"}},
		{"notify_id missing", map[string]string{"notify_id": ""}},
		{"trade_status missing", map[string]string{"trade_status": ""}},
		{"trade_status unknown", map[string]string{"trade_status": "TRADE_PENDING"}},
		{"out_trade_no missing", map[string]string{"out_trade_no": ""}},
		{"trade_no missing", map[string]string{"trade_no": ""}},
		{"cross-border trans_currency", map[string]string{"trans_currency": "USD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, alipay.Config{})
			body := signAlipay(t, notification(tc.changes), b.key)
			_, err := b.verifier.Verify(http.Header{}, []byte(body), now)
			require.ErrorIs(t, err, payment.ErrMalformed)
			require.NotErrorIs(t, err, payment.ErrSignature)
		})
	}
}

func TestVerify_EmptyValue_IsPartOfTheSignedContent(t *testing.T) {
	t.Parallel()
	b := setup(t, alipay.Config{})
	params := notification(nil)
	params["passback_params"] = ""
	body := signAlipay(t, params, b.key)
	require.Contains(t, body, "passback_params=&")

	_, err := b.verifier.Verify(http.Header{}, []byte(body), now)
	require.NoError(t, err)

	dropped := strings.Replace(body, "passback_params=&", "", 1)
	_, err = b.verifier.Verify(http.Header{}, []byte(dropped), now)
	require.ErrorIs(t, err, payment.ErrSignature)
}

// A notification Alipay signed for another app or another seller's trade
// verifies with Alipay's key (shared by the apps of one account), but is
// not this merchant's: refused as unverified, whatever it says.
func TestVerify_NotificationOfAnotherMerchant_IsRefusedAsUnverified(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cfg     alipay.Config
		changes map[string]string
		want    error
	}{
		{"another app's", alipay.Config{AppID: "2021000117659999"}, nil, alipay.ErrAppID},
		{"no app_id", alipay.Config{}, map[string]string{"app_id": ""}, alipay.ErrAppID},
		{"app_id differing in case", alipay.Config{AppID: "2021000117650001A"}, map[string]string{"app_id": "2021000117650001a"}, alipay.ErrAppID},
		{"another seller's trade", alipay.Config{SellerID: "2088102119689999"}, nil, alipay.ErrSellerID},
		{"no seller_id where one is expected", alipay.Config{SellerID: testSellerID}, map[string]string{"seller_id": ""}, alipay.ErrSellerID},
		{"another seller's trade of another app", alipay.Config{AppID: "2021000117659999", SellerID: "2088102119689999"}, nil, alipay.ErrAppID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.cfg)
			body := signAlipay(t, notification(tc.changes), b.key)
			ev, err := b.verifier.Verify(http.Header{}, []byte(body), now)
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, payment.ErrSignature, "refused as a notification not verified as this endpoint's")
			require.NotErrorIs(t, err, payment.ErrMalformed)
			require.Zero(t, ev)
		})
	}
}

func TestVerify_NotificationOfThisMerchant_IsRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cfg     alipay.Config
		changes map[string]string
	}{
		{"app_id only configured", alipay.Config{AppID: testAppID}, nil},
		{"app_id only configured, no seller_id sent", alipay.Config{AppID: testAppID}, map[string]string{"seller_id": ""}},
		{"app_id and seller_id configured", alipay.Config{AppID: testAppID, SellerID: testSellerID}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.cfg)
			ev, err := b.verifier.Verify(http.Header{}, []byte(signAlipay(t, notification(tc.changes), b.key)), now)
			require.NoError(t, err)
			require.Equal(t, testAppID, ev.Scope)
			require.Equal(t, payment.Succeeded, ev.Kind)
		})
	}
}

func TestVerify_BodyOverTheLimit_IsErrTooLarge(t *testing.T) {
	t.Parallel()
	t.Run("configured limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, alipay.Config{MaxBodyBytes: 100})
		body := signAlipay(t, notification(nil), b.key)
		_, err := b.verifier.Verify(http.Header{}, []byte(body), now)
		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
	t.Run("default limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, alipay.Config{})
		body := signAlipay(t, notification(map[string]string{"body": strings.Repeat("x", payment.MaxBodyBytes)}), b.key)
		_, err := b.verifier.Verify(http.Header{}, []byte(body), now)
		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
}

func TestNew_InvalidConfig_IsRefused(t *testing.T) {
	t.Parallel()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cfg  alipay.Config
	}{
		{"no public key", alipay.Config{AppID: testAppID}},
		{"no app id", alipay.Config{PublicKey: &alipayKey().PublicKey}},
		{"a key under 2048 bits", alipay.Config{PublicKey: &small.PublicKey, AppID: testAppID}},
		{"a negative body limit", alipay.Config{PublicKey: &alipayKey().PublicKey, AppID: testAppID, MaxBodyBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := alipay.New(tc.cfg)
			require.Error(t, err)
		})
	}
	_, err = alipay.New(alipay.Config{PublicKey: &alipayKey().PublicKey})
	require.ErrorContains(t, err, "AppID", "the error names the field to set")
}

func TestAcknowledge_WritesSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, alipay.Config{})
	rec := httptest.NewRecorder()
	b.verifier.Acknowledge(rec)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "success", rec.Body.String())
	require.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain"))
}

func TestRefuse_WritesFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status, want int
	}{
		{http.StatusBadRequest, http.StatusBadRequest},
		{http.StatusServiceUnavailable, http.StatusServiceUnavailable},
		{http.StatusOK, http.StatusInternalServerError},
		{0, http.StatusInternalServerError},
	} {
		b := setup(t, alipay.Config{})
		rec := httptest.NewRecorder()
		b.verifier.Refuse(rec, tc.status, "signature not verified")
		require.Equal(t, tc.want, rec.Code)
		require.Equal(t, "fail", rec.Body.String())
	}
}

func TestProvider_IsAlipay(t *testing.T) {
	t.Parallel()
	require.Equal(t, "alipay", setup(t, alipay.Config{}).verifier.Provider())
}

// Alipay sends each redelivery anew: its own notify_time, its parameters
// in any order. It is the same event, with the same digest; a change to
// what was paid is not.
func TestVerify_RedeliverySentAnew_HasTheSameDigest(t *testing.T) {
	t.Parallel()
	b := setup(t, alipay.Config{})
	first, err := b.verifier.Verify(http.Header{}, []byte(signAlipay(t, notification(nil), b.key)), now)
	require.NoError(t, err)

	resent, err := url.ParseQuery(signAlipay(t, notification(map[string]string{"notify_time": "2024-06-12 01:04:03"}), b.key))
	require.NoError(t, err)
	again, err := b.verifier.Verify(http.Header{}, []byte(resent.Encode()), now) // Encode sorts: another order
	require.NoError(t, err)
	require.Equal(t, first, again)

	changed, err := b.verifier.Verify(http.Header{}, []byte(signAlipay(t, notification(map[string]string{"total_amount": "12.35"}), b.key)), now)
	require.NoError(t, err)
	require.Equal(t, first.ID, changed.ID)
	require.NotEqual(t, first.Digest, changed.Digest, "another amount under the same notify_id is another payload")
}
