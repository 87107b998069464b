package metrics_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/metrics"
	"github.com/orderguard/idempotency/payment"
)

func newPaymentCollector(t *testing.T, opts ...metrics.Option) (*metrics.PaymentCollector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	c, err := metrics.NewPaymentCollector(reg, opts...)
	require.NoError(t, err)
	return c, reg
}

func TestPaymentResultOf_ClassifiesByReplayAndTheRefusalsSentinel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		obs  payment.Observation
		want metrics.PaymentResult
	}{
		{"handled", payment.Observation{Status: 200}, metrics.PaymentAcknowledged},
		{"handled, an anomaly", payment.Observation{Status: 200, Outcome: idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyUnknownOrder}}, metrics.PaymentAcknowledged},
		{"redelivered", payment.Observation{Status: 200, Replayed: true}, metrics.PaymentReplayed},
		{"bad signature", payment.Observation{Refused: fmt.Errorf("%w: wrong key", payment.ErrSignature)}, metrics.PaymentRefusedSignature},
		{"stale", payment.Observation{Refused: payment.ErrStale}, metrics.PaymentRefusedStale},
		{"malformed", payment.Observation{Refused: payment.ErrMalformed}, metrics.PaymentRefusedMalformed},
		{"too large", payment.Observation{Refused: payment.ErrTooLarge}, metrics.PaymentRefusedTooLarge},
		{"store down", payment.Observation{Refused: errors.New("payment: the event was not applied (503)")}, metrics.PaymentRefusedUnavailable},
		{"a protocol problem", payment.Observation{Refused: &idempotency.Problem{Status: 409, RetryAfter: 1}}, metrics.PaymentRefusedUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, metrics.PaymentResultOf(tc.obs))
		})
	}
}

func TestPaymentCollector_CountsOneResultPerCallback_AnomaliesAtTheFirstDeliveryOnly(t *testing.T) {
	t.Parallel()
	c, reg := newPaymentCollector(t)
	unknown := idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyUnknownOrder}
	for _, obs := range []payment.Observation{
		{Provider: "stripe", Status: 200},
		{Provider: "stripe", Status: 200, Outcome: unknown},
		{Provider: "stripe", Status: 200, Outcome: unknown, Replayed: true}, // the same anomaly, redelivered
		{Provider: "stripe", Status: 200, Outcome: idempotency.PaymentOutcome{Applied: true, Anomaly: idempotency.AnomalyRefundOwed}},
		{Provider: "stripe", Refused: payment.ErrSignature, Status: 400},
		{Provider: "alipay", Refused: payment.ErrSignature, Status: 400},
		{Provider: "alipay", Refused: payment.ErrStale, Status: 400},
		{Provider: "alipay", Refused: errors.New("database down"), Status: 503},
		{Provider: "alipay", Status: 200, Outcome: idempotency.PaymentOutcome{Anomaly: idempotency.AnomalyPayloadMismatch}},
	} {
		c.Observe(obs)
	}

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idempotency_payment_anomalies_total Payment callbacks whose event was recorded as an anomaly (unknown-order, amount-mismatch, refund-owed, ...), by reason; first deliveries only. idemctl anomalies lists them.
# TYPE idempotency_payment_anomalies_total counter
idempotency_payment_anomalies_total{provider="alipay",reason="payload-mismatch"} 1
idempotency_payment_anomalies_total{provider="stripe",reason="refund-owed"} 1
idempotency_payment_anomalies_total{provider="stripe",reason="unknown-order"} 1
# HELP idempotency_payment_callbacks_total Payment provider callbacks by result (acknowledged, replayed, refused-signature, refused-stale, refused-malformed, refused-too-large, refused-unavailable); exactly one per callback.
# TYPE idempotency_payment_callbacks_total counter
idempotency_payment_callbacks_total{provider="alipay",result="acknowledged"} 1
idempotency_payment_callbacks_total{provider="alipay",result="refused-signature"} 1
idempotency_payment_callbacks_total{provider="alipay",result="refused-stale"} 1
idempotency_payment_callbacks_total{provider="alipay",result="refused-unavailable"} 1
idempotency_payment_callbacks_total{provider="stripe",result="acknowledged"} 3
idempotency_payment_callbacks_total{provider="stripe",result="refused-signature"} 1
idempotency_payment_callbacks_total{provider="stripe",result="replayed"} 1
`)))
}

func TestNewPaymentCollector_WithProviders_PreinitialisesEverySeriesAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newPaymentCollector(t, metrics.WithProviders("stripe", "alipay"), metrics.WithConstLabels(prometheus.Labels{"service": "orders"}))
	require.Equal(t, 2*7, testutil.CollectAndCount(reg, "idempotency_payment_callbacks_total"))
	require.Equal(t, 2*9, testutil.CollectAndCount(reg, "idempotency_payment_anomalies_total"))
	require.Zero(t, value(t, reg, "idempotency_payment_callbacks_total", "provider", "alipay", "result", "refused-signature", "service", "orders"))
	require.NotNil(t, find(t, reg, "idempotency_payment_anomalies_total", "provider", "stripe", "reason", string(payment.AnomalyInvalidEvent), "service", "orders"))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestNewPaymentCollector_SameRegistryTwice_SharesTheMetrics_BesideTheObserver(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	_, err := metrics.New(reg)
	require.NoError(t, err)
	a, err := metrics.NewPaymentCollector(reg)
	require.NoError(t, err)
	b, err := metrics.NewPaymentCollector(reg)
	require.NoError(t, err)
	a.Observe(payment.Observation{Provider: "stripe"})
	b.Observe(payment.Observation{Provider: "stripe"})
	require.EqualValues(t, 2, value(t, reg, "idempotency_payment_callbacks_total", "provider", "stripe", "result", "acknowledged"))
}

func TestNewPaymentCollector_NilRegisterer_ReturnsError(t *testing.T) {
	t.Parallel()
	_, err := metrics.NewPaymentCollector(nil)
	require.ErrorContains(t, err, "prometheus.Registerer")
}

// jsonVerifier plays a provider: a body is a JSON payment.Event, signed
// when the header X-Signature is "ok".
type jsonVerifier struct{}

func (jsonVerifier) Provider() string { return "test" }

func (jsonVerifier) Verify(h http.Header, body []byte, _ time.Time) (payment.Event, error) {
	if h.Get("X-Signature") != "ok" {
		return payment.Event{}, payment.ErrSignature
	}
	var ev payment.Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return payment.Event{}, fmt.Errorf("%w: %v", payment.ErrMalformed, err)
	}
	sum := sha256.Sum256(body)
	ev.Provider, ev.Digest = "test", hex.EncodeToString(sum[:])
	return ev, nil
}

func (jsonVerifier) Acknowledge(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }

func (jsonVerifier) Refuse(w http.ResponseWriter, status int, message string) {
	http.Error(w, message, status)
}

// Through a real Webhook over MariaDB: the Observation the webhook gives
// is counted as it should be.
func TestPaymentCollector_ObservesAWebhook(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MySQL(t)
	ctx := context.Background()
	require.NoError(t, idempotency.Migrate(ctx, db))
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Route: "test_events"})
	require.NoError(t, err)
	c, reg := newPaymentCollector(t, metrics.WithProviders("test"))
	h, err := payment.NewWebhook(payment.Config{Verifier: jsonVerifier{}, Middleware: mw, Orders: idempotency.MySQLOrders,
		DB: db, Observe: c.Observe})
	require.NoError(t, err)

	deliver := func(signature string, ev payment.Event) int {
		body, err := json.Marshal(ev)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/callbacks", strings.NewReader(string(body)))
		req.Header.Set("X-Signature", signature)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	unknown := payment.Event{ID: "evt-1", Kind: payment.Succeeded, OrderNo: "O-nowhere", PaymentID: "pi-1", Amount: 990, Currency: "CNY"}
	require.Equal(t, http.StatusOK, deliver("ok", unknown))
	require.Equal(t, http.StatusOK, deliver("ok", unknown), "a redelivery is a replay")
	require.Equal(t, http.StatusBadRequest, deliver("forged", unknown))

	callbacks := func(result metrics.PaymentResult) float64 {
		return value(t, reg, "idempotency_payment_callbacks_total", "provider", "test", "result", string(result))
	}
	require.EqualValues(t, 1, callbacks(metrics.PaymentAcknowledged))
	require.EqualValues(t, 1, callbacks(metrics.PaymentReplayed))
	require.EqualValues(t, 1, callbacks(metrics.PaymentRefusedSignature))
	require.EqualValues(t, 1, value(t, reg, "idempotency_payment_anomalies_total", "provider", "test", "reason", "unknown-order"),
		"the anomaly once, at its first delivery")
	require.EqualValues(t, 3, sumOf(t, reg, "idempotency_payment_callbacks_total"), "one result per callback")
}

// sumOf is the sum of every series of a counter family.
func sumOf(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
