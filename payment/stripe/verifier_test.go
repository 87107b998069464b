package idemstripe_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/orderguard/idempotency/payment"
	idemstripe "github.com/orderguard/idempotency/payment/stripe"
)

const (
	secret    = "whsec_test_current_0123456789abcdef"
	oldSecret = "whsec_test_old_fedcba9876543210"
	strange   = "whsec_test_someone_elses_secret"
)

var now = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

type testBundle struct {
	verifier *idemstripe.Verifier
}

func setup(t *testing.T, cfg idemstripe.Config) *testBundle {
	t.Helper()
	if cfg.Secrets == nil {
		cfg.Secrets = []string{secret}
	}
	v, err := idemstripe.New(cfg)
	require.NoError(t, err)
	return &testBundle{verifier: v}
}

// signed returns the header Stripe would send with body, signed by
// stripe-go's own test signer with secret at the instant at.
func signed(body []byte, secret string, at time.Time) http.Header {
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
		Payload:   body,
		Secret:    secret,
		Timestamp: at,
	})
	h := http.Header{}
	h.Set(idemstripe.SignatureHeader, p.Header)
	return h
}

// stripeEvent returns the body of a Stripe event of type typ whose
// data.object is object; account is the Connect account, or "".
func stripeEvent(id, typ, account, object string) []byte {
	acct := "null"
	if account != "" {
		acct = `"` + account + `"`
	}
	return []byte(`{
  "id": "` + id + `",
  "object": "event",
  "account": ` + acct + `,
  "api_version": "2024-06-20",
  "created": 1741944413,
  "livemode": false,
  "pending_webhooks": 1,
  "request": {"id": "req_1", "idempotency_key": "k-1"},
  "type": "` + typ + `",
  "data": {"object": ` + object + `}
}`)
}

const (
	paymentIntentWithOrder = `{"id": "pi_3Ps1", "object": "payment_intent", "amount": 1999,
		"amount_received": 1999, "currency": "usd", "status": "succeeded",
		"metadata": {"order_no": "A-1001"}}`
	paymentIntentWithoutOrder = `{"id": "pi_3Ps2", "object": "payment_intent", "amount": 500,
		"amount_received": 500, "currency": "eur", "status": "succeeded", "metadata": {}}`
	paymentIntentPartlyCaptured = `{"id": "pi_3Ps3", "object": "payment_intent", "amount": 10000,
		"amount_received": 7500, "currency": "usd", "status": "succeeded",
		"metadata": {"order_no": "A-1003"}}`
	chargeRefunded = `{"id": "ch_3Ps1", "object": "charge", "amount": 1999, "amount_captured": 1999,
		"amount_refunded": 1500, "currency": "usd", "refunded": false,
		"payment_intent": "pi_3Ps1", "metadata": {"order_no": "A-1001"}}`
	chargeRefundedLegacy = `{"id": "ch_legacy", "object": "charge", "amount": 800,
		"amount_refunded": 800, "currency": "gbp", "refunded": true,
		"payment_intent": null, "metadata": {}}`
)

func refund(status string) string {
	return `{"id": "re_3Ps1", "object": "refund", "amount": 500, "charge": "ch_3Ps1",
		"currency": "usd", "payment_intent": "pi_3Ps1", "status": "` + status + `",
		"metadata": {}}`
}

func TestVerify_SignedEvents_AreReadByType(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		body []byte
		want payment.Event
	}{
		{
			name: "payment_intent.succeeded is Succeeded for metadata.order_no with amount_received",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder),
			want: payment.Event{ID: "evt_1", Type: "payment_intent.succeeded", Kind: payment.Succeeded,
				OrderNo: "A-1001", PaymentID: "pi_3Ps1", Amount: 1999, Currency: "USD"},
		},
		{
			name: "payment_intent.succeeded without order_no is Succeeded with no order, not lost",
			body: stripeEvent("evt_2", "payment_intent.succeeded", "", paymentIntentWithoutOrder),
			want: payment.Event{ID: "evt_2", Type: "payment_intent.succeeded", Kind: payment.Succeeded,
				OrderNo: "", PaymentID: "pi_3Ps2", Amount: 500, Currency: "EUR"},
		},
		{
			name: "payment_intent.succeeded after a partial capture is the amount received",
			body: stripeEvent("evt_3", "payment_intent.succeeded", "", paymentIntentPartlyCaptured),
			want: payment.Event{ID: "evt_3", Type: "payment_intent.succeeded", Kind: payment.Succeeded,
				OrderNo: "A-1003", PaymentID: "pi_3Ps3", Amount: 7500, Currency: "USD"},
		},
		{
			name: "Connect account's event is scoped by its account",
			body: stripeEvent("evt_4", "payment_intent.succeeded", "acct_1Connected", paymentIntentWithOrder),
			want: payment.Event{ID: "evt_4", Scope: "acct_1Connected", Type: "payment_intent.succeeded",
				Kind: payment.Succeeded, OrderNo: "A-1001", PaymentID: "pi_3Ps1", Amount: 1999, Currency: "USD"},
		},
		{
			name: "charge.refunded is Refunded with the cumulative amount_refunded and no RefundID",
			body: stripeEvent("evt_5", "charge.refunded", "", chargeRefunded),
			want: payment.Event{ID: "evt_5", Type: "charge.refunded", Kind: payment.Refunded,
				OrderNo: "A-1001", PaymentID: "pi_3Ps1", Amount: 1500, Currency: "USD"},
		},
		{
			name: "charge.refunded of a legacy charge names the charge as the payment",
			body: stripeEvent("evt_6", "charge.refunded", "", chargeRefundedLegacy),
			want: payment.Event{ID: "evt_6", Type: "charge.refunded", Kind: payment.Refunded,
				PaymentID: "ch_legacy", Amount: 800, Currency: "GBP"},
		},
		{
			name: "refund.created succeeded is Refunded with this refund's amount",
			body: stripeEvent("evt_7", "refund.created", "", refund("succeeded")),
			want: payment.Event{ID: "evt_7", Type: "refund.created", Kind: payment.Refunded,
				PaymentID: "pi_3Ps1", RefundID: "re_3Ps1", Amount: 500, Currency: "USD"},
		},
		{
			name: "refund.updated succeeded is Refunded",
			body: stripeEvent("evt_8", "refund.updated", "", refund("succeeded")),
			want: payment.Event{ID: "evt_8", Type: "refund.updated", Kind: payment.Refunded,
				PaymentID: "pi_3Ps1", RefundID: "re_3Ps1", Amount: 500, Currency: "USD"},
		},
		{
			name: "charge.refund.updated succeeded is Refunded",
			body: stripeEvent("evt_9", "charge.refund.updated", "", refund("succeeded")),
			want: payment.Event{ID: "evt_9", Type: "charge.refund.updated", Kind: payment.Refunded,
				PaymentID: "pi_3Ps1", RefundID: "re_3Ps1", Amount: 500, Currency: "USD"},
		},
		{
			name: "refund's metadata.order_no names the order",
			body: stripeEvent("evt_10", "refund.created", "", strings.Replace(refund("succeeded"),
				`"metadata": {}`, `"metadata": {"order_no": "A-1001"}`, 1)),
			want: payment.Event{ID: "evt_10", Type: "refund.created", Kind: payment.Refunded,
				OrderNo: "A-1001", PaymentID: "pi_3Ps1", RefundID: "re_3Ps1", Amount: 500, Currency: "USD"},
		},
		{
			name: "refund.created pending is Ignored",
			body: stripeEvent("evt_11", "refund.created", "", refund("pending")),
			want: payment.Event{ID: "evt_11", Type: "refund.created", Kind: payment.Ignored},
		},
		{
			name: "refund.updated requires_action is Ignored",
			body: stripeEvent("evt_12", "refund.updated", "", refund("requires_action")),
			want: payment.Event{ID: "evt_12", Type: "refund.updated", Kind: payment.Ignored},
		},
		{
			name: "refund.updated failed is Ignored",
			body: stripeEvent("evt_13", "refund.updated", "", refund("failed")),
			want: payment.Event{ID: "evt_13", Type: "refund.updated", Kind: payment.Ignored},
		},
		{
			name: "charge.refund.updated canceled is Ignored",
			body: stripeEvent("evt_14", "charge.refund.updated", "", refund("canceled")),
			want: payment.Event{ID: "evt_14", Type: "charge.refund.updated", Kind: payment.Ignored},
		},
		{
			name: "another type is Ignored, whatever its object",
			body: stripeEvent("evt_15", "customer.created", "", `{"id": "cus_1", "object": "customer"}`),
			want: payment.Event{ID: "evt_15", Type: "customer.created", Kind: payment.Ignored},
		},
		{
			name: "payment_intent.payment_failed is Ignored",
			body: stripeEvent("evt_16", "payment_intent.payment_failed", "", paymentIntentWithOrder),
			want: payment.Event{ID: "evt_16", Type: "payment_intent.payment_failed", Kind: payment.Ignored},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{})

			got, err := b.verifier.Verify(signed(tc.body, secret, now), tc.body, now)

			require.NoError(t, err)
			digest := sha256.Sum256(tc.body)
			tc.want.Provider = "stripe"
			tc.want.Digest = hex.EncodeToString(digest[:])
			require.Equal(t, tc.want, got)
		})
	}
}

func TestVerify_NotSignedWithTheSecret_IsErrSignature(t *testing.T) {
	t.Parallel()

	body := stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder)
	good := signed(body, secret, now).Get(idemstripe.SignatureHeader)
	tests := []struct {
		name   string
		header http.Header
		body   []byte
		stripe error // the stripe-go error it also matches
	}{
		{
			name:   "a body changed by one byte",
			header: signed(body, secret, now),
			body:   []byte(strings.Replace(string(body), `"amount_received": 1999`, `"amount_received": 1998`, 1)),
			stripe: webhook.ErrNoValidSignature,
		},
		{
			name:   "signed with another secret",
			header: signed(body, strange, now),
			body:   body,
			stripe: webhook.ErrNoValidSignature,
		},
		{
			name:   "no Stripe-Signature header",
			header: http.Header{},
			body:   body,
			stripe: webhook.ErrNotSigned,
		},
		{
			name:   "an empty Stripe-Signature header",
			header: http.Header{"Stripe-Signature": {""}},
			body:   body,
			stripe: webhook.ErrNotSigned,
		},
		{
			name:   "a header that is not name=value pairs",
			header: http.Header{"Stripe-Signature": {"garbage"}},
			body:   body,
			stripe: webhook.ErrInvalidHeader,
		},
		{
			name:   "a v0 signature only",
			header: http.Header{"Stripe-Signature": {strings.Replace(good, "v1=", "v0=", 1)}},
			body:   body,
			stripe: webhook.ErrNoValidSignature,
		},
		{
			name:   "a signature moved to another timestamp",
			header: http.Header{"Stripe-Signature": {strings.Replace(good, "t=", "t=1", 1)}},
			body:   body,
			stripe: webhook.ErrNoValidSignature,
		},
		{
			name:   "a stale timestamp with a wrong signature is unsigned first",
			header: signed(body, strange, now.Add(-time.Hour)),
			body:   body,
			stripe: webhook.ErrNoValidSignature,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{})

			_, err := b.verifier.Verify(tc.header, tc.body, now)

			require.ErrorIs(t, err, payment.ErrSignature)
			require.ErrorIs(t, err, tc.stripe)
		})
	}
}

func TestVerify_SignatureHeaderKey_IsMatchedIgnoringCase(t *testing.T) {
	t.Parallel()
	b := setup(t, idemstripe.Config{})
	body := stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder)
	h := http.Header{"stripe-signature": {signed(body, secret, now).Get("Stripe-Signature")}}

	got, err := b.verifier.Verify(h, body, now)

	require.NoError(t, err)
	require.Equal(t, payment.Succeeded, got.Kind)
}

func TestVerify_RolledSecret_AnyConfiguredSecretVerifies(t *testing.T) {
	t.Parallel()
	body := stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder)
	bothSignatures := signed(body, oldSecret, now).Get("Stripe-Signature") + ",v1=" +
		hex.EncodeToString(webhook.ComputeSignature(now, body, secret))

	tests := []struct {
		name    string
		header  http.Header
		wantErr error
	}{
		{name: "signed with the old secret", header: signed(body, oldSecret, now)},
		{name: "signed with the new secret", header: signed(body, secret, now)},
		{name: "signed with both, as Stripe does while rolling", header: http.Header{"Stripe-Signature": {bothSignatures}}},
		{name: "signed with a third secret", header: signed(body, strange, now), wantErr: payment.ErrSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{Secrets: []string{oldSecret, secret}})

			got, err := b.verifier.Verify(tc.header, body, now)

			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "evt_1", got.ID)
		})
	}
}

func TestVerify_SignedTimestampAgainstNow_IsErrStaleOutsideTolerance(t *testing.T) {
	t.Parallel()
	body := stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder)

	tests := []struct {
		name      string
		tolerance time.Duration
		signedAt  time.Time
		wantErr   error
	}{
		{name: "signed 6 minutes ago is stale", signedAt: now.Add(-6 * time.Minute), wantErr: payment.ErrStale},
		{name: "signed 6 minutes ahead is stale", signedAt: now.Add(6 * time.Minute), wantErr: payment.ErrStale},
		{name: "signed 4 minutes ago is accepted", signedAt: now.Add(-4 * time.Minute)},
		{name: "signed exactly the tolerance ago is accepted", signedAt: now.Add(-payment.DefaultTolerance)},
		{name: "signed 4 minutes ahead is accepted", signedAt: now.Add(4 * time.Minute)},
		{name: "configured tolerance: 6 minutes ago within 10", tolerance: 10 * time.Minute, signedAt: now.Add(-6 * time.Minute)},
		{name: "configured tolerance: 2 minutes ago outside 1", tolerance: time.Minute, signedAt: now.Add(-2 * time.Minute), wantErr: payment.ErrStale},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{Tolerance: tc.tolerance})

			_, err := b.verifier.Verify(signed(body, secret, tc.signedAt), body, now)

			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.ErrorIs(t, err, webhook.ErrTooOld)
				require.NotErrorIs(t, err, payment.ErrSignature)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestVerify_SignedButUnreadable_IsErrMalformed(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		body []byte
	}{
		{name: "not JSON", body: []byte("not json")},
		{name: "no event id", body: stripeEvent("", "payment_intent.succeeded", "", paymentIntentWithOrder)},
		{name: "no data.object", body: []byte(`{"id": "evt_1", "object": "event", "type": "charge.refunded", "data": {}}`)},
		{name: "payment_intent.succeeded carrying a charge",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", chargeRefunded)},
		{name: "charge.refunded carrying a refund",
			body: stripeEvent("evt_1", "charge.refunded", "", refund("succeeded"))},
		{name: "payment intent without id",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", strings.Replace(paymentIntentWithOrder, `"pi_3Ps1"`, `""`, 1))},
		{name: "payment intent without currency",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", strings.Replace(paymentIntentWithOrder, `"usd"`, `""`, 1))},
		{name: "amount as a string",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", strings.Replace(paymentIntentWithOrder, `"amount_received": 1999`, `"amount_received": "1999"`, 1))},
		{name: "amount as a float",
			body: stripeEvent("evt_1", "payment_intent.succeeded", "", strings.Replace(paymentIntentWithOrder, `"amount_received": 1999`, `"amount_received": 19.99`, 1))},
		{name: "succeeded refund naming no payment",
			body: stripeEvent("evt_1", "refund.created", "", strings.NewReplacer(`"charge": "ch_3Ps1"`, `"charge": null`,
				`"payment_intent": "pi_3Ps1"`, `"payment_intent": null`).Replace(refund("succeeded")))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{})

			_, err := b.verifier.Verify(signed(tc.body, secret, now), tc.body, now)

			require.ErrorIs(t, err, payment.ErrMalformed)
		})
	}
}

func TestVerify_BodyOverTheLimit_IsErrTooLarge(t *testing.T) {
	t.Parallel()

	t.Run("configured limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemstripe.Config{MaxBodyBytes: 100})
		body := stripeEvent("evt_1", "payment_intent.succeeded", "", paymentIntentWithOrder)

		_, err := b.verifier.Verify(signed(body, secret, now), body, now)

		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
	t.Run("default limit, checked before the signature", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemstripe.Config{})
		body := make([]byte, payment.MaxBodyBytes+1)

		_, err := b.verifier.Verify(http.Header{}, body, now)

		require.ErrorIs(t, err, payment.ErrTooLarge)
	})
}

func TestNew_InvalidConfig_IsRefused(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		cfg  idemstripe.Config
	}{
		{name: "no secret", cfg: idemstripe.Config{}},
		{name: "an empty secret", cfg: idemstripe.Config{Secrets: []string{secret, ""}}},
		{name: "an API key as the secret", cfg: idemstripe.Config{Secrets: []string{"sk_test_123"}}},
		{name: "the bare prefix", cfg: idemstripe.Config{Secrets: []string{"whsec_"}}},
		{name: "a negative tolerance", cfg: idemstripe.Config{Secrets: []string{secret}, Tolerance: -time.Second}},
		{name: "a negative body limit", cfg: idemstripe.Config{Secrets: []string{secret}, MaxBodyBytes: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			v, err := idemstripe.New(tc.cfg)

			require.Error(t, err)
			require.Nil(t, v)
		})
	}
}

func TestAcknowledge_Writes200ReceivedJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, idemstripe.Config{})
	rec := httptest.NewRecorder()

	b.verifier.Acknowledge(rec)

	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"received":true}`, rec.Body.String())
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
		{name: "a success status is written as 500", status: http.StatusOK, wantStatus: http.StatusInternalServerError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemstripe.Config{})
			rec := httptest.NewRecorder()

			b.verifier.Refuse(rec, tc.status, "signature not verified")

			require.Equal(t, tc.wantStatus, rec.Code)
			require.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"))
			require.Equal(t, "signature not verified\n", rec.Body.String())
		})
	}
}

func TestProvider_IsStripe(t *testing.T) {
	t.Parallel()
	require.Equal(t, "stripe", setup(t, idemstripe.Config{}).verifier.Provider())
}
