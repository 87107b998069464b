package idemstandard_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
)

var (
	secret    = "whsec_" + base64.StdEncoding.EncodeToString([]byte("current secret of the endpoint!!"))
	oldSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("old secret, rolled away shortly."))
	strange   = "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret this endpoint never had"))
)

var now = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

const msgID = "msg_2Lh7Zq"

type testBundle struct {
	verifier *idemstandard.Verifier
}

func setup(t *testing.T, cfg idemstandard.Config) *testBundle {
	t.Helper()
	if cfg.Secrets == nil {
		cfg.Secrets = []string{secret}
	}
	v, err := idemstandard.New(cfg)
	require.NoError(t, err)
	return &testBundle{verifier: v}
}

// signature returns the library's "v1,<base64>" signature of the message.
func signature(t *testing.T, secret, id string, at time.Time, body []byte) string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	sig, err := wh.Sign(id, at, body)
	require.NoError(t, err)
	return sig
}

// signed returns the headers a sender posts with body, signed by the
// Standard Webhooks library with secret at the instant at.
func signed(t *testing.T, secret, id string, at time.Time, body []byte) http.Header {
	t.Helper()
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, signature(t, secret, id, at, body))
	return h
}

const (
	succeeded = `{
  "type": "payment.succeeded",
  "timestamp": "2025-03-14T09:26:50Z",
  "data": {
    "order_no": "A-1001",
    "payment_id": "pay_7Hq2",
    "amount": 1999,
    "currency": "USD"
  }
}`
	refundedOne = `{"type": "payment.refunded", "timestamp": "2025-03-15T10:00:00+08:00",
		"data": {"order_no": "A-1001", "payment_id": "pay_7Hq2", "refund_id": "rf_91", "amount": 500, "currency": "USD"}}`
	refundedSoFar = `{"type": "payment.refunded", "timestamp": "2025-03-15T10:00:00.123Z",
		"data": {"payment_id": "pay_7Hq2", "amount": 1500, "currency": "USD"}}`
)

func TestVerify_SignedPaymentEvents_AreReadBySchema(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		body string
		want payment.Event
	}{
		{
			name: "payment.succeeded is Succeeded for order_no",
			body: succeeded,
			want: payment.Event{Type: "payment.succeeded", Kind: payment.Succeeded,
				OrderNo: "A-1001", PaymentID: "pay_7Hq2", Amount: 1999, Currency: "USD"},
		},
		{
			name: "payment.refunded with refund_id is this refund's amount",
			body: refundedOne,
			want: payment.Event{Type: "payment.refunded", Kind: payment.Refunded,
				OrderNo: "A-1001", PaymentID: "pay_7Hq2", RefundID: "rf_91", Amount: 500, Currency: "USD"},
		},
		{
			name: "payment.refunded without refund_id nor order_no is the whole refunded amount of the payment",
			body: refundedSoFar,
			want: payment.Event{Type: "payment.refunded", Kind: payment.Refunded,
				PaymentID: "pay_7Hq2", Amount: 1500, Currency: "USD"},
		},
		{
			name: "an amount of zero is accepted",
			body: `{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z",
				"data": {"order_no": "A-0", "payment_id": "pay_0", "amount": 0, "currency": "JPY"}}`,
			want: payment.Event{Type: "payment.succeeded", Kind: payment.Succeeded,
				OrderNo: "A-0", PaymentID: "pay_0", Amount: 0, Currency: "JPY"},
		},
		{
			name: "unknown fields are ignored",
			body: `{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z", "livemode": true,
				"data": {"order_no": "A-1", "payment_id": "pay_1", "amount": 10, "currency": "EUR", "method": "card"}}`,
			want: payment.Event{Type: "payment.succeeded", Kind: payment.Succeeded,
				OrderNo: "A-1", PaymentID: "pay_1", Amount: 10, Currency: "EUR"},
		},
		{
			name: "another type is Ignored, whatever its data",
			body: `{"type": "customer.created", "data": {"amount": "not read"}}`,
			want: payment.Event{Type: "customer.created", Kind: payment.Ignored},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{})
			body := []byte(tc.body)

			got, err := b.verifier.Verify(signed(t, secret, msgID, now, body), body, now)

			require.NoError(t, err)
			digest := sha256.Sum256(body)
			tc.want.Provider = "standard"
			tc.want.ID = msgID
			tc.want.Digest = hex.EncodeToString(digest[:])
			require.Equal(t, tc.want, got)
		})
	}
}

func TestVerify_NotSignedWithTheSecret_IsErrSignature(t *testing.T) {
	t.Parallel()

	body := []byte(succeeded)
	with := func(name, value string) http.Header {
		h := signed(t, secret, msgID, now, body)
		h.Set(name, value)
		return h
	}
	without := func(name string) http.Header {
		h := signed(t, secret, msgID, now, body)
		h.Del(name)
		return h
	}
	tests := []struct {
		name    string
		header  http.Header
		body    []byte
		library error // the library's error it also matches
	}{
		{
			name:    "a body changed by one byte",
			header:  signed(t, secret, msgID, now, body),
			body:    []byte(strings.Replace(succeeded, "1999", "1998", 1)),
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "signed with another secret",
			header:  signed(t, strange, msgID, now, body),
			body:    body,
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "another webhook-id than the signed one",
			header:  with("webhook-id", "msg_other"),
			body:    body,
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "another webhook-timestamp than the signed one",
			header:  with("webhook-timestamp", strconv.FormatInt(now.Unix()+1, 10)),
			body:    body,
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "no webhook-id header",
			header:  without("webhook-id"),
			body:    body,
			library: standardwebhooks.ErrRequiredHeaders,
		},
		{
			name:    "no webhook-timestamp header",
			header:  without("webhook-timestamp"),
			body:    body,
			library: standardwebhooks.ErrRequiredHeaders,
		},
		{
			name:    "no webhook-signature header",
			header:  without("webhook-signature"),
			body:    body,
			library: standardwebhooks.ErrRequiredHeaders,
		},
		{
			name:    "an empty webhook-signature header",
			header:  with("webhook-signature", ""),
			body:    body,
			library: standardwebhooks.ErrRequiredHeaders,
		},
		{
			name:    "a webhook-timestamp that is not Unix seconds",
			header:  with("webhook-timestamp", now.Format(time.RFC3339)),
			body:    body,
			library: standardwebhooks.ErrInvalidHeaders,
		},
		{
			name:    "a valid signature under another version",
			header:  with("webhook-signature", strings.Replace(signature(t, secret, msgID, now, body), "v1,", "v1a,", 1)),
			body:    body,
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "a stale timestamp with a wrong signature is unsigned first",
			header:  signed(t, strange, msgID, now.Add(-time.Hour), body),
			body:    body,
			library: standardwebhooks.ErrNoMatchingSignature,
		},
		{
			name:    "a malformed body with a wrong signature is unsigned first",
			header:  signed(t, strange, msgID, now, []byte("not json")),
			body:    []byte("not json"),
			library: standardwebhooks.ErrNoMatchingSignature,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{})

			_, err := b.verifier.Verify(tc.header, tc.body, now)

			require.ErrorIs(t, err, payment.ErrSignature)
			require.ErrorIs(t, err, tc.library)
		})
	}
}

func TestVerify_SeveralSignaturesInOneHeader_AnyValidOneVerifies(t *testing.T) {
	t.Parallel()
	body := []byte(succeeded)
	good := signature(t, secret, msgID, now, body)
	other := signature(t, strange, msgID, now, body)

	tests := []struct {
		name      string
		signature string
		wantErr   error
	}{
		{name: "the valid one last", signature: other + " " + good},
		{name: "the valid one first", signature: good + " " + other},
		{name: "among an unknown version and a wrong one", signature: "v2,c2lnbmF0dXJl " + other + " " + good},
		{name: "none valid", signature: other + " " + signature(t, oldSecret, msgID, now, body), wantErr: payment.ErrSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{})
			h := signed(t, secret, msgID, now, body)
			h.Set("webhook-signature", tc.signature)

			got, err := b.verifier.Verify(h, body, now)

			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, payment.Succeeded, got.Kind)
		})
	}
}

func TestVerify_RolledSecret_AnyConfiguredSecretVerifies(t *testing.T) {
	t.Parallel()
	body := []byte(succeeded)

	tests := []struct {
		name    string
		secret  string
		wantErr error
	}{
		{name: "signed with the old secret", secret: oldSecret},
		{name: "signed with the new secret", secret: secret},
		{name: "signed with a third secret", secret: strange, wantErr: payment.ErrSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{Secrets: []string{oldSecret, secret}})

			got, err := b.verifier.Verify(signed(t, tc.secret, msgID, now, body), body, now)

			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, msgID, got.ID)
		})
	}
}

func TestVerify_SignedTimestampAgainstNow_IsErrStaleOutsideTolerance(t *testing.T) {
	t.Parallel()
	body := []byte(succeeded)

	tests := []struct {
		name      string
		tolerance time.Duration
		signedAt  time.Time
		wantErr   error // besides payment.ErrStale, the library's error
	}{
		{name: "signed 6 minutes ago is stale", signedAt: now.Add(-6 * time.Minute), wantErr: standardwebhooks.ErrMessageTooOld},
		{name: "signed 6 minutes ahead is stale", signedAt: now.Add(6 * time.Minute), wantErr: standardwebhooks.ErrMessageTooNew},
		{name: "signed 4 minutes ago is accepted", signedAt: now.Add(-4 * time.Minute)},
		{name: "signed exactly the tolerance ago is accepted", signedAt: now.Add(-payment.DefaultTolerance)},
		{name: "signed 4 minutes ahead is accepted", signedAt: now.Add(4 * time.Minute)},
		{name: "configured tolerance: 6 minutes ago within 10", tolerance: 10 * time.Minute, signedAt: now.Add(-6 * time.Minute)},
		{name: "configured tolerance: 2 minutes ago outside 1", tolerance: time.Minute, signedAt: now.Add(-2 * time.Minute), wantErr: standardwebhooks.ErrMessageTooOld},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{Tolerance: tc.tolerance})

			_, err := b.verifier.Verify(signed(t, secret, msgID, tc.signedAt, body), body, now)

			if tc.wantErr != nil {
				require.ErrorIs(t, err, payment.ErrStale)
				require.ErrorIs(t, err, tc.wantErr)
				require.NotErrorIs(t, err, payment.ErrSignature)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestVerify_SignedButNotTheSchema_IsErrMalformed(t *testing.T) {
	t.Parallel()

	// data returns a payment.succeeded body whose data is fields.
	data := func(fields string) string {
		return `{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z", "data": {` + fields + `}}`
	}
	const ok = `"order_no": "A-1", "payment_id": "pay_1", "currency": "USD", `
	tests := []struct {
		name string
		body string
	}{
		{name: "not JSON", body: "not json"},
		{name: "a JSON array", body: `[{"type": "payment.succeeded"}]`},
		{name: "no type", body: `{"timestamp": "2025-03-14T09:26:50Z", "data": {}}`},
		{name: "an empty type", body: `{"type": "", "data": {}}`},
		{name: "a type that is not a string", body: `{"type": 1, "data": {}}`},
		{name: "no timestamp", body: `{"type": "payment.succeeded", "data": {` + ok + `"amount": 1}}`},
		{name: "a timestamp that is not RFC 3339", body: `{"type": "payment.succeeded", "timestamp": "14/03/2025", "data": {` + ok + `"amount": 1}}`},
		{name: "a timestamp in Unix seconds", body: `{"type": "payment.succeeded", "timestamp": 1741944410, "data": {` + ok + `"amount": 1}}`},
		{name: "no data", body: `{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z"}`},
		{name: "data null", body: `{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z", "data": null}`},
		{name: "no payment_id", body: data(`"order_no": "A-1", "currency": "USD", "amount": 1`)},
		{name: "succeeded without order_no", body: data(`"payment_id": "pay_1", "currency": "USD", "amount": 1`)},
		{name: "succeeded with a refund_id", body: data(ok + `"refund_id": "rf_1", "amount": 1`)},
		{name: "refunded with an empty refund_id",
			body: `{"type": "payment.refunded", "timestamp": "2025-03-14T09:26:50Z", "data": {` + ok + `"refund_id": "", "amount": 1}}`},
		{name: "an order_no that is not a string", body: data(`"order_no": 1001, "payment_id": "pay_1", "currency": "USD", "amount": 1`)},
		{name: "no amount", body: data(`"order_no": "A-1", "payment_id": "pay_1", "currency": "USD"`)},
		{name: "an amount null", body: data(ok + `"amount": null`)},
		{name: "an amount with a fraction", body: data(ok + `"amount": 19.99`)},
		{name: "an integral amount written as a float", body: data(ok + `"amount": 1999.0`)},
		{name: "an amount with an exponent", body: data(ok + `"amount": 2e3`)},
		{name: "an amount as a string", body: data(ok + `"amount": "1999"`)},
		{name: "a negative amount", body: data(ok + `"amount": -1`)},
		{name: "an amount over int64", body: data(ok + `"amount": 9223372036854775808`)},
		{name: "no currency", body: data(`"order_no": "A-1", "payment_id": "pay_1", "amount": 1`)},
		{name: "a lower-case currency", body: data(`"order_no": "A-1", "payment_id": "pay_1", "currency": "usd", "amount": 1`)},
		{name: "a currency of four letters", body: data(`"order_no": "A-1", "payment_id": "pay_1", "currency": "USDT", "amount": 1`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{})
			body := []byte(tc.body)

			_, err := b.verifier.Verify(signed(t, secret, msgID, now, body), body, now)

			require.ErrorIs(t, err, payment.ErrMalformed)
		})
	}
}

func TestVerify_HeaderKeys_AreMatchedIgnoringCase(t *testing.T) {
	t.Parallel()
	b := setup(t, idemstandard.Config{})
	body := []byte(succeeded)
	canonical := signed(t, secret, msgID, now, body)
	h := http.Header{
		"webhook-id":        {canonical.Get("Webhook-Id")},
		"WEBHOOK-TIMESTAMP": {canonical.Get("Webhook-Timestamp")},
		"Webhook-signature": {canonical.Get("Webhook-Signature")},
	}

	got, err := b.verifier.Verify(h, body, now)

	require.NoError(t, err)
	require.Equal(t, msgID, got.ID)
}

func TestVerify_BodyOverTheLimit_IsErrTooLarge(t *testing.T) {
	t.Parallel()

	t.Run("configured limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemstandard.Config{MaxBodyBytes: 100})
		body := []byte(succeeded)

		_, err := b.verifier.Verify(signed(t, secret, msgID, now, body), body, now)

		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
	t.Run("default limit, checked before the signature", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemstandard.Config{})
		body := make([]byte, payment.MaxBodyBytes+1)

		_, err := b.verifier.Verify(http.Header{}, body, now)

		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
}

func TestSign_Headers_AreTheLibrarySignatureAndVerify(t *testing.T) {
	t.Parallel()
	b := setup(t, idemstandard.Config{})
	body := []byte(refundedOne)

	h, err := idemstandard.Sign(secret, msgID, now, body)

	require.NoError(t, err)
	require.Equal(t, msgID, h.Get("webhook-id"))
	require.Equal(t, strconv.FormatInt(now.Unix(), 10), h.Get("webhook-timestamp"))
	require.Equal(t, signature(t, secret, msgID, now, body), h.Get("webhook-signature"))
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	require.NoError(t, wh.VerifyIgnoringTimestamp(body, h))
	got, err := b.verifier.Verify(h, body, now)
	require.NoError(t, err)
	require.Equal(t, "rf_91", got.RefundID)
}

func TestSign_InvalidInput_IsRefused(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		secret string
		id     string
	}{
		{name: "no message id", secret: secret, id: ""},
		{name: "a secret that is not base64", secret: "whsec_not base64!", id: msgID},
		{name: "an empty secret", secret: "whsec_", id: msgID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			h, err := idemstandard.Sign(tc.secret, tc.id, now, []byte(succeeded))

			require.Error(t, err)
			require.Nil(t, h)
		})
	}
}

func TestNew_InvalidConfig_IsRefused(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		cfg  idemstandard.Config
	}{
		{name: "no secret", cfg: idemstandard.Config{}},
		{name: "an empty secret", cfg: idemstandard.Config{Secrets: []string{secret, ""}}},
		{name: "the bare prefix", cfg: idemstandard.Config{Secrets: []string{"whsec_"}}},
		{name: "a secret that is not base64", cfg: idemstandard.Config{Secrets: []string{"whsec_not base64!"}}},
		{name: "a negative tolerance", cfg: idemstandard.Config{Secrets: []string{secret}, Tolerance: -time.Second}},
		{name: "a negative body limit", cfg: idemstandard.Config{Secrets: []string{secret}, MaxBodyBytes: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			v, err := idemstandard.New(tc.cfg)

			require.Error(t, err)
			require.Nil(t, v)
		})
	}
}

func TestAcknowledge_Writes204(t *testing.T) {
	t.Parallel()
	b := setup(t, idemstandard.Config{})
	rec := httptest.NewRecorder()

	b.verifier.Acknowledge(rec)

	require.Equal(t, http.StatusNoContent, rec.Code)
	require.Empty(t, rec.Body.String())
}

func TestRefuse_WritesStatusAndPlainMessage(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name       string
		status     int
		wantStatus int
	}{
		{name: "a client error is kept", status: http.StatusBadRequest, wantStatus: http.StatusBadRequest},
		{name: "a server error is kept", status: http.StatusServiceUnavailable, wantStatus: http.StatusServiceUnavailable},
		{name: "a success status is written as 500", status: http.StatusNoContent, wantStatus: http.StatusInternalServerError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstandard.Config{})
			rec := httptest.NewRecorder()

			b.verifier.Refuse(rec, tc.status, "signature not verified")

			require.Equal(t, tc.wantStatus, rec.Code)
			require.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"))
			require.Equal(t, "signature not verified\n", rec.Body.String())
		})
	}
}

func TestProvider_IsStandard(t *testing.T) {
	t.Parallel()
	require.Equal(t, "standard", setup(t, idemstandard.Config{}).verifier.Provider())
}
