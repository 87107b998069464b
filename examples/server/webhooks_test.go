package main

// The payment callbacks as the providers send them: each provider's
// callback signed exactly as the provider signs it, for an order created
// through POST /orders, served by the server's own mux with the routes the
// flags mount, on a real database.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/frontendtest"
	"github.com/orderguard/idempotency/internal/testdb"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/sqlite"
)

// The providers' test credentials. The RSA keys are made once per run
// (keygen is slow); the secrets are fixed.
const (
	testStripeSecret   = "whsec_test_stripe_endpoint_secret"
	testWechatSerial   = "PUB_KEY_ID_0114232134912410000000000000"
	testWechatAPIv3Key = "an APIv3 key, exactly 32 bytes.."
	testAlipayAppID    = "2021000117650001" // alipayNotification's app_id
	testAlipaySellerID = "2088102119685838" // and its seller_id
)

var testStandardSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("a Standard Webhooks test secret"))

var (
	testAlipayKey = sync.OnceValue(func() *rsa.PrivateKey { return newRSAKey() })
	testWechatKey = sync.OnceValue(func() *rsa.PrivateKey { return newRSAKey() })
)

func newRSAKey() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
}

// writePublicKeyPEM writes key's public half as a PEM PUBLIC KEY file.
func writePublicKeyPEM(t *testing.T, key *rsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "public.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600))
	return file
}

// allProviderFlags are the flags of all four providers with the test keys.
func allProviderFlags(t *testing.T) []string {
	t.Helper()
	return []string{
		"-stripe-webhook-secret", testStripeSecret,
		"-webhook-secret", testStandardSecret,
		"-alipay-public-key", writePublicKeyPEM(t, testAlipayKey()),
		"-alipay-app-id", testAlipayAppID, "-alipay-seller-id", testAlipaySellerID,
		"-wechatpay-public-key", writePublicKeyPEM(t, testWechatKey()),
		"-wechatpay-serial", testWechatSerial,
		"-wechatpay-apiv3-key", testWechatAPIv3Key,
	}
}

type webhookBundle struct {
	db     *sql.DB
	svc    *orderservice.Service
	srv    *httptest.Server
	orders int64 // user ids, one per order, so that tests share no coupon or key
}

// setupWebhooks serves the service on dialect with the webhook routes
// that args (the server's flags) mount, as run mounts them.
func setupWebhooks(t *testing.T, dialect string, args ...string) *webhookBundle {
	t.Helper()
	f, err := parseFlags(args)
	require.NoError(t, err)
	hooks, err := f.webhooks.routes()
	require.NoError(t, err)

	b := &webhookBundle{orders: 5000}
	var store idempotency.Store
	switch dialect {
	case "sqlite":
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "orders.db"))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		b.db, store = db, sqlite.NewStore(db)
	case "mysql":
		b.db, _ = testdb.MySQL(t)
		store = idempotency.NewMySQLStore(b.db)
	case "postgres":
		b.db, _ = pgtest.Postgres(t)
		store = postgres.NewStore(b.db)
	}
	require.NoError(t, orderservice.Setup(context.Background(), b.db, dialect))
	b.svc, err = orderservice.New(b.db, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect})
	require.NoError(t, err)
	mux := routes(http.NotFoundHandler(), b.svc)
	require.NoError(t, mountWebhooks(mux, b.svc, hooks, slog.New(slog.DiscardHandler)))
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

// createOrder creates an order of 1000 cents (CNY) through POST /orders
// for a user of its own, and returns its number and user.
func (b *webhookBundle) createOrder(t *testing.T) (orderNo string, user int64) {
	t.Helper()
	user = atomic.AddInt64(&b.orders, 1)
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/orders",
		strings.NewReader(fmt.Sprintf(`{"user_id":%d,"sku_id":20001,"quantity":1}`, user)))
	require.NoError(t, err)
	req.Header.Set("X-User-ID", strconv.FormatInt(user, 10))
	req.Header.Set("Idempotency-Key", "create")
	req.Header.Set("Content-Type", "application/json")
	status, _, body := b.do(t, req)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	var o orderservice.OrderResponse
	require.NoError(t, json.Unmarshal(body, &o))
	require.Equal(t, int64(1000), o.TotalCents)
	return o.OrderNo, user
}

// view is GET /orders/{order_no}'s answer.
func (b *webhookBundle) view(t *testing.T, orderNo string, user int64) orderservice.OrderView {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+"/orders/"+orderNo, nil)
	require.NoError(t, err)
	req.Header.Set("X-User-ID", strconv.FormatInt(user, 10))
	status, _, body := b.do(t, req)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var v orderservice.OrderView
	require.NoError(t, json.Unmarshal(body, &v))
	return v
}

// cancel is POST /orders/{order_no}/cancel under key.
func (b *webhookBundle) cancel(t *testing.T, orderNo string, user int64, key string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/orders/"+orderNo+"/cancel", nil)
	require.NoError(t, err)
	req.Header.Set("X-User-ID", strconv.FormatInt(user, 10))
	req.Header.Set("Idempotency-Key", key)
	status, _, body := b.do(t, req)
	return status, body
}

// deliver posts a callback to path as a provider does: again after a 503
// (on MariaDB, two events of neighbouring orders can deadlock on InnoDB's
// gap locks, and the one rolled back is answered 503 for redelivery), at
// most a few times.
func (b *webhookBundle) deliver(t *testing.T, path string, cb callback) (int, http.Header, []byte) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, bytes.NewReader(cb.body))
		require.NoError(t, err)
		for k, v := range cb.header {
			req.Header[k] = v
		}
		status, header, body := b.do(t, req)
		if status != http.StatusServiceUnavailable || attempt == 5 {
			return status, header, body
		}
		t.Logf("%s: attempt %d answered 503 (%s); delivering it again, as the provider would", path, attempt, body)
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *webhookBundle) do(t *testing.T, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, body
}

// payment reads the facts of a provider payment.
func (b *webhookBundle) payment(t *testing.T, provider, paymentID string) *idempotency.Payment {
	t.Helper()
	p, err := b.svc.PaymentOrders().GetPayment(context.Background(), b.db, provider, paymentID)
	require.NoError(t, err)
	return p
}

// callback is one delivery: the headers and the raw body a provider posts.
type callback struct {
	header http.Header
	body   []byte
}

// provider is one provider's route, its callbacks signed as it signs them,
// and its success answer.
type provider struct {
	name, path string
	// success and refund are the callbacks of an order's payment and its
	// full refund; ids are fresh per order.
	success, refund func(t *testing.T, orderNo, paymentID string) callback
	// forge is a refund the provider did not send: signed with another
	// secret, or changed after it was signed.
	forge   func(t *testing.T, orderNo, paymentID string) callback
	ack     int
	ackBody string
}

var providers = []provider{
	{name: "stripe", path: "/webhooks/stripe", ack: http.StatusOK, ackBody: `{"received":true}`,
		success: func(t *testing.T, orderNo, pi string) callback {
			return stripeCallback(testStripeSecret, fmt.Sprintf(`{"id":"evt_%[1]s","object":"event","type":"payment_intent.succeeded",`+
				`"data":{"object":{"id":"%[1]s","object":"payment_intent","amount":1000,"amount_received":1000,"currency":"cny","metadata":{"order_no":"%[2]s"}}}}`, pi, orderNo))
		},
		refund: func(t *testing.T, orderNo, pi string) callback {
			return stripeCallback(testStripeSecret, fmt.Sprintf(`{"id":"evt_refund_%[1]s","object":"event","type":"charge.refunded",`+
				`"data":{"object":{"id":"ch_%[1]s","object":"charge","amount":1000,"amount_refunded":1000,"currency":"cny","payment_intent":"%[1]s","metadata":{"order_no":"%[2]s"}}}}`, pi, orderNo))
		},
		forge: func(t *testing.T, orderNo, pi string) callback {
			return stripeCallback("whsec_not_this_endpoints_secret", fmt.Sprintf(`{"id":"evt_forged_%[1]s","object":"event","type":"charge.refunded",`+
				`"data":{"object":{"id":"ch_%[1]s","object":"charge","amount":1000,"amount_refunded":1000,"currency":"cny","payment_intent":"%[1]s","metadata":{"order_no":"%[2]s"}}}}`, pi, orderNo))
		},
	},
	{name: "standard", path: "/webhooks/standard", ack: http.StatusNoContent,
		success: func(t *testing.T, orderNo, pay string) callback {
			return standardCallback(t, testStandardSecret, "msg_"+pay, fmt.Sprintf(`{"type":"payment.succeeded","timestamp":"2025-03-14T09:26:53Z",`+
				`"data":{"order_no":"%s","payment_id":"%s","amount":1000,"currency":"CNY"}}`, orderNo, pay))
		},
		refund: func(t *testing.T, orderNo, pay string) callback {
			return standardCallback(t, testStandardSecret, "msg_refund_"+pay, fmt.Sprintf(`{"type":"payment.refunded","timestamp":"2025-03-15T10:00:00Z",`+
				`"data":{"order_no":"%s","payment_id":"%s","refund_id":"rf_%s","amount":1000,"currency":"CNY"}}`, orderNo, pay, pay))
		},
		forge: func(t *testing.T, orderNo, pay string) callback {
			other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("not this endpoint's secret"))
			return standardCallback(t, other, "msg_forged_"+pay, fmt.Sprintf(`{"type":"payment.refunded","timestamp":"2025-03-15T10:00:00Z",`+
				`"data":{"order_no":"%s","payment_id":"%s","refund_id":"rf_%s","amount":1000,"currency":"CNY"}}`, orderNo, pay, pay))
		},
	},
	{name: "alipay", path: "/webhooks/alipay", ack: http.StatusOK, ackBody: "success",
		success: func(t *testing.T, orderNo, tradeNo string) callback {
			return alipayCallback(t, alipayNotification(orderNo, tradeNo, "N-"+tradeNo, nil))
		},
		refund: func(t *testing.T, orderNo, tradeNo string) callback {
			return alipayCallback(t, alipayNotification(orderNo, tradeNo, "N-REFUND-"+tradeNo, map[string]string{
				"trade_status": "TRADE_CLOSED", "refund_fee": "10.00", "out_biz_no": "R-" + tradeNo, "gmt_refund": "2024-06-12 10:00:00.123",
			}))
		},
		forge: func(t *testing.T, orderNo, tradeNo string) callback {
			// A partial refund's notice, its refund_fee raised after it
			// was signed.
			cb := alipayCallback(t, alipayNotification(orderNo, tradeNo, "N-FORGED-"+tradeNo, map[string]string{
				"refund_fee": "1.00", "out_biz_no": "R-" + tradeNo, "gmt_refund": "2024-06-12 10:00:00.123",
			}))
			cb.body = bytes.Replace(cb.body, []byte("refund_fee=1.00"), []byte("refund_fee=10.00"), 1)
			return cb
		},
	},
	{name: "wechatpay", path: "/webhooks/wechatpay", ack: http.StatusNoContent,
		success: func(t *testing.T, orderNo, txID string) callback {
			return wechatCallback(t, testWechatKey(), "EV-"+txID, "TRANSACTION.SUCCESS", "transaction", map[string]any{
				"mchid": "1900000109", "appid": "wxd678efh567hg6787", "out_trade_no": orderNo, "transaction_id": txID,
				"trade_type": "JSAPI", "trade_state": "SUCCESS", "trade_state_desc": "支付成功", "bank_type": "OTHERS",
				"success_time": "2024-06-11T22:33:59+08:00", "payer": map[string]any{"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
				"amount": map[string]any{"total": 1000, "payer_total": 1000, "currency": "CNY", "payer_currency": "CNY"},
			})
		},
		refund: func(t *testing.T, orderNo, txID string) callback {
			return wechatCallback(t, testWechatKey(), "EV-REFUND-"+txID, "REFUND.SUCCESS", "refund", wechatRefund(orderNo, txID))
		},
		forge: func(t *testing.T, orderNo, txID string) callback {
			// Signed by a key that is not WeChat Pay's.
			return wechatCallback(t, testAlipayKey(), "EV-FORGED-"+txID, "REFUND.SUCCESS", "refund", wechatRefund(orderNo, txID))
		},
	},
}

func TestWebhook_EachProvider_PaysOnceRefusesForgeriesAndRefunds(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			b := setupWebhooks(t, dialect, allProviderFlags(t)...)
			for _, p := range providers {
				t.Run(p.name, func(t *testing.T) {
					t.Parallel()
					orderNo, user := b.createOrder(t)
					paymentID := "pay" + strings.ToLower(orderNo)
					require.Equal(t, "CREATED", b.view(t, orderNo, user).Status)
					ack := func(t *testing.T, cb callback, what string) {
						t.Helper()
						status, _, body := b.deliver(t, p.path, cb)
						require.Equal(t, p.ack, status, "%s: %s", what, body)
						require.Equal(t, p.ackBody, strings.TrimSpace(string(body)), what)
					}

					// The payment: acknowledged, the order PAID.
					success := p.success(t, orderNo, paymentID)
					ack(t, success, "the payment")
					v := b.view(t, orderNo, user)
					require.Equal(t, "PAID", v.Status)
					require.Equal(t, "CNY", v.Currency)
					require.Equal(t, int64(0), v.RefundedCents)

					// The provider delivers it again: acknowledged, applied once.
					ack(t, success, "the redelivery")
					require.Equal(t, "PAID", b.view(t, orderNo, user).Status)
					pay := b.payment(t, p.name, paymentID)
					require.Equal(t, 1, pay.EventsApplied, "the payment is applied once")
					require.Equal(t, orderNo, pay.OrderNo)
					require.Equal(t, int64(1000), pay.AmountCents)

					// A refund the provider did not send: 400, nothing changed.
					status, _, body := b.deliver(t, p.path, p.forge(t, orderNo, paymentID))
					require.Equal(t, http.StatusBadRequest, status, "%s", body)
					require.Equal(t, "PAID", b.view(t, orderNo, user).Status)
					require.Equal(t, *pay, *b.payment(t, p.name, paymentID), "the forgery changed nothing")

					// The full refund: REFUNDED, with what was refunded.
					ack(t, p.refund(t, orderNo, paymentID), "the refund")
					v = b.view(t, orderNo, user)
					require.Equal(t, "REFUNDED", v.Status)
					require.Equal(t, int64(1000), v.RefundedCents)
					require.Equal(t, 2, b.payment(t, p.name, paymentID).EventsApplied)
				})
			}
		})
	}
}

// A user's cancel after the payment is the payment state machine's cancel
// request: the order is CANCELED and owes its refund, and the provider's
// refund then makes it REFUNDED, as the refund then the cancel would.
func TestWebhook_CancelOfAPaidOrder_IsCanceledOwingTheRefundUntilItArrives(t *testing.T) {
	t.Parallel()
	b := setupWebhooks(t, "mysql", "-stripe-webhook-secret", testStripeSecret)
	stripe := providers[0]
	orderNo, user := b.createOrder(t)
	paymentID := "pi_" + strings.ToLower(orderNo)
	status, _, body := b.deliver(t, stripe.path, stripe.success(t, orderNo, paymentID))
	require.Equal(t, http.StatusOK, status, "%s", body)

	status, body = b.cancel(t, orderNo, user, "cancel-1")
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Contains(t, string(body), `"status":"CANCELED"`)
	require.NotContains(t, string(body), "refunded_cents", "only GET shows the payment state")
	anomalies, err := b.svc.PaymentOrders().ListAnomalies(context.Background(), b.db, 100)
	require.NoError(t, err)
	require.Len(t, anomalies, 1)
	require.Equal(t, idempotency.AnomalyRefundOwed, anomalies[0].Reason)
	require.Equal(t, orderNo, anomalies[0].OrderNo)
	require.Equal(t, int64(1000), anomalies[0].AmountCents)

	again, againBody := b.cancel(t, orderNo, user, "cancel-2")
	require.Equal(t, http.StatusConflict, again, "a second cancel under a new key: %s", againBody)
	require.Contains(t, string(againBody), orderservice.ProblemInvalidTransition)

	status, _, body = b.deliver(t, stripe.path, stripe.refund(t, orderNo, paymentID))
	require.Equal(t, http.StatusOK, status, "%s", body)
	v := b.view(t, orderNo, user)
	require.Equal(t, "REFUNDED", v.Status)
	require.Equal(t, int64(1000), v.RefundedCents)
	anomalies, err = b.svc.PaymentOrders().ListAnomalies(context.Background(), b.db, 100)
	require.NoError(t, err)
	require.Empty(t, anomalies, "the refund owed has arrived")
}

// -alipay-app-id and -alipay-seller-id: a notification Alipay signed for
// another app, or for another seller's trade, is refused as Alipay reads a
// refusal ("fail"), and nothing is written; the merchant's own is applied.
func TestWebhook_AlipayNotificationOfAnotherMerchant_IsRefused(t *testing.T) {
	t.Parallel()
	b := setupWebhooks(t, "mysql", "-alipay-public-key", writePublicKeyPEM(t, testAlipayKey()),
		"-alipay-app-id", testAlipayAppID, "-alipay-seller-id", testAlipaySellerID)
	orderNo, user := b.createOrder(t)
	tradeNo := "T" + orderNo
	for name, change := range map[string]map[string]string{
		"another app":    {"app_id": "2021000117659999", "auth_app_id": "2021000117659999"},
		"another seller": {"seller_id": "2088102119689999"},
	} {
		cb := alipayCallback(t, alipayNotification(orderNo, tradeNo, "N-OTHER-"+strings.ReplaceAll(name, " ", "-"), change))
		status, _, body := b.deliver(t, "/webhooks/alipay", cb)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", name, body)
		require.Equal(t, "fail", string(body), name)
	}
	var records int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key LIKE 'N-OTHER-%'").Scan(&records))
	require.Zero(t, records, "nothing recorded")
	require.Equal(t, "CREATED", b.view(t, orderNo, user).Status, "nothing applied")

	status, _, body := b.deliver(t, "/webhooks/alipay", alipayCallback(t, alipayNotification(orderNo, tradeNo, "N-"+tradeNo, nil)))
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Equal(t, "PAID", b.view(t, orderNo, user).Status)
}

// -webhook-tolerance: a callback signed 7 minutes ago is stale by the
// default 5 minutes (400, nothing written), and within 10 minutes when the
// flag says so.
func TestWebhook_Tolerance_IsTheFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		status int
	}{
		{"default", nil, http.StatusBadRequest},
		{"10m", []string{"-webhook-tolerance", "10m"}, http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupWebhooks(t, "sqlite", append([]string{"-webhook-secret", testStandardSecret}, tc.args...)...)
			orderNo, user := b.createOrder(t)
			body := fmt.Sprintf(`{"type":"payment.succeeded","timestamp":"2025-03-14T09:26:53Z",`+
				`"data":{"order_no":"%s","payment_id":"pay_%s","amount":1000,"currency":"CNY"}}`, orderNo, orderNo)
			header, err := idemstandard.Sign(testStandardSecret, "msg_late_"+orderNo, time.Now().Add(-7*time.Minute), []byte(body))
			require.NoError(t, err)
			header.Set("Content-Type", "application/json")
			status, _, answer := b.deliver(t, "/webhooks/standard", callback{header: header, body: []byte(body)})
			require.Equal(t, tc.status, status, "%s", answer)
			want := map[int]string{http.StatusBadRequest: "CREATED", http.StatusNoContent: "PAID"}[tc.status]
			require.Equal(t, want, b.view(t, orderNo, user).Status)
		})
	}
}

func TestWebhook_RouteWithoutItsSecret_Is404(t *testing.T) {
	t.Parallel()
	b := setupWebhooks(t, "sqlite", "-stripe-webhook-secret", testStripeSecret)
	for _, path := range []string{"/webhooks/standard", "/webhooks/alipay", "/webhooks/wechatpay"} {
		status, _, body := b.deliver(t, path, callback{body: []byte(`{}`)})
		require.Equal(t, http.StatusNotFound, status, "%s: %s", path, body)
	}
	status, _, body := b.deliver(t, "/webhooks/stripe", callback{body: []byte(`{}`)})
	require.Equal(t, http.StatusBadRequest, status, "the configured route refuses an unsigned callback: %s", body)
}

func TestWebhook_StartupFlags_RefusedWithTheFlagToFix(t *testing.T) {
	t.Parallel()
	pemFile := writePublicKeyPEM(t, testWechatKey())
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a key"), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"wechatpay without its serial", []string{"-wechatpay-public-key", pemFile, "-wechatpay-apiv3-key", testWechatAPIv3Key}, "-wechatpay-serial"},
		{"wechatpay without its APIv3 key", []string{"-wechatpay-public-key", pemFile, "-wechatpay-serial", testWechatSerial}, "-wechatpay-apiv3-key"},
		{"wechatpay without its public key", []string{"-wechatpay-serial", testWechatSerial, "-wechatpay-apiv3-key", testWechatAPIv3Key}, "-wechatpay-public-key"},
		{"an APIv3 key of the wrong length", []string{"-wechatpay-public-key", pemFile, "-wechatpay-serial", testWechatSerial, "-wechatpay-apiv3-key", "short"}, "-wechatpay-apiv3-key"},
		{"an unreadable Alipay key file", []string{"-alipay-public-key", filepath.Join(t.TempDir(), "missing.pem"), "-alipay-app-id", testAlipayAppID}, "-alipay-public-key"},
		{"an Alipay key file that is no key", []string{"-alipay-public-key", notPEM, "-alipay-app-id", testAlipayAppID}, "-alipay-public-key"},
		{"an Alipay key without the app", []string{"-alipay-public-key", pemFile}, "-alipay-app-id"},
		{"an Alipay key without the app, with the seller", []string{"-alipay-public-key", pemFile, "-alipay-seller-id", testAlipaySellerID}, "-alipay-app-id"},
		{"the Alipay app without the key", []string{"-alipay-app-id", testAlipayAppID}, "-alipay-public-key"},
		{"the Alipay seller without the key", []string{"-alipay-seller-id", testAlipaySellerID}, "-alipay-public-key"},
		{"a WeChat Pay key file that is no key", []string{"-wechatpay-public-key", notPEM, "-wechatpay-serial", testWechatSerial, "-wechatpay-apiv3-key", testWechatAPIv3Key}, "-wechatpay-public-key"},
		{"a Stripe secret without whsec_", []string{"-stripe-webhook-secret", "sk_test_123"}, "-stripe-webhook-secret"},
		{"a rotated Stripe secret without whsec_", []string{"-stripe-webhook-secret", testStripeSecret + ",sk_test_123"}, "-stripe-webhook-secret"},
		{"a Standard Webhooks secret without whsec_", []string{"-webhook-secret", "c2VjcmV0"}, "-webhook-secret"},
		{"a Standard Webhooks secret that is not base64", []string{"-webhook-secret", "whsec_!!!"}, "-webhook-secret"},
		{"webhooks without idempotency", []string{"-idempotency=false", "-stripe-webhook-secret", testStripeSecret}, "need the idempotency protocol"},
		{"a tolerance of zero", []string{"-webhook-secret", testStandardSecret, "-webhook-tolerance", "0s"}, "-webhook-tolerance"},
		{"a negative tolerance", []string{"-stripe-webhook-secret", testStripeSecret, "-webhook-tolerance", "-1m"}, "-webhook-tolerance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// run refuses before it opens anything: -db names a database
			// that would fail differently.
			err := run(append([]string{"-db", "unknown://nowhere"}, tc.args...))
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "sk_test_123", "a secret never shows in an error")
		})
	}
}

// stripeCallback is payload as Stripe posts it: Stripe-Signature made by
// stripe-go's webhook.GenerateTestSignedPayload with secret, now.
func stripeCallback(secret, payload string) callback {
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
		Payload: []byte(payload), Secret: secret, Timestamp: time.Now(),
	})
	return callback{header: http.Header{"Stripe-Signature": {signed.Header}, "Content-Type": {"application/json"}}, body: signed.Payload}
}

// standardCallback is body as a Standard Webhooks sender posts it, message
// id, signed with secret by idemstandard.Sign, now.
func standardCallback(t *testing.T, secret, id, body string) callback {
	t.Helper()
	header, err := idemstandard.Sign(secret, id, time.Now(), []byte(body))
	require.NoError(t, err)
	header.Set("Content-Type", "application/json")
	return callback{header: header, body: []byte(body)}
}

// alipayNotification is a TRADE_SUCCESS notification of 10.00 CNY for
// orderNo, with changes applied.
func alipayNotification(orderNo, tradeNo, notifyID string, changes map[string]string) map[string]string {
	params := map[string]string{
		"notify_time": "2024-06-11 22:34:03", "notify_type": "trade_status_sync", "notify_id": notifyID,
		"charset": "utf-8", "version": "1.0", "app_id": testAlipayAppID, "auth_app_id": testAlipayAppID,
		"trade_no": tradeNo, "out_trade_no": orderNo, "seller_id": testAlipaySellerID,
		"trade_status": "TRADE_SUCCESS", "total_amount": "10.00", "receipt_amount": "10.00", "buyer_pay_amount": "10.00",
		"subject": "测试订单 a+b=c&d", "gmt_create": "2024-06-11 22:33:46", "gmt_payment": "2024-06-11 22:33:59",
	}
	for name, value := range changes {
		params[name] = value
	}
	return params
}

// alipayCallback signs params as Alipay signs an asynchronous notification
// and posts them as a form: every parameter but sign and sign_type, sorted
// by name, name=value joined by '&' (values not URL-encoded), signed
// SHA256withRSA (RSA2) with Alipay's key, base64.
func alipayCallback(t *testing.T, params map[string]string) callback {
	t.Helper()
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	sort.Strings(names)
	pairs := make([]string, len(names))
	for i, name := range names {
		pairs[i] = name + "=" + params[name]
	}
	digest := sha256.Sum256([]byte(strings.Join(pairs, "&")))
	signature, err := rsa.SignPKCS1v15(rand.Reader, testAlipayKey(), crypto.SHA256, digest[:])
	require.NoError(t, err)
	form := url.Values{}
	for name, value := range params {
		form.Set(name, value)
	}
	form.Set("sign", base64.StdEncoding.EncodeToString(signature))
	form.Set("sign_type", "RSA2")
	return callback{header: http.Header{"Content-Type": {"application/x-www-form-urlencoded; charset=utf-8"}}, body: []byte(form.Encode())}
}

func wechatRefund(orderNo, txID string) map[string]any {
	return map[string]any{
		"mchid": "1900000109", "out_trade_no": orderNo, "transaction_id": txID,
		"out_refund_no": "R-" + txID, "refund_id": "5000" + txID, "refund_status": "SUCCESS",
		"success_time": "2024-06-12T10:00:00+08:00", "user_received_account": "招商银行信用卡0403",
		"amount": map[string]any{"total": 1000, "refund": 1000, "payer_total": 1000, "payer_refund": 1000},
	}
}

// wechatCallback is a WeChat Pay API v3 notification as WeChat Pay posts
// it: the plaintext encrypted AEAD_AES_256_GCM with the APIv3 key into the
// envelope's resource, and the envelope signed SHA256withRSA by key over
// "timestamp\nnonce\nbody\n", in the Wechatpay-* headers.
func wechatCallback(t *testing.T, key *rsa.PrivateKey, id, eventType, associatedData string, plaintext map[string]any) callback {
	t.Helper()
	data, err := json.Marshal(plaintext)
	require.NoError(t, err)
	block, err := aes.NewCipher([]byte(testWechatAPIv3Key))
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	const nonce = "fdasflkja484"
	body, err := json.Marshal(map[string]any{
		"id": id, "create_time": "2024-06-11T22:34:03+08:00", "resource_type": "encrypt-resource",
		"event_type": eventType, "summary": "支付成功",
		"resource": map[string]string{
			"original_type": associatedData, "algorithm": "AEAD_AES_256_GCM", "associated_data": associatedData, "nonce": nonce,
			"ciphertext": base64.StdEncoding.EncodeToString(aead.Seal(nil, []byte(nonce), data, []byte(associatedData))),
		},
	})
	require.NoError(t, err)
	timestamp, headerNonce := strconv.FormatInt(time.Now().Unix(), 10), "5K8264ILTKCH16CQ2502SI8ZNMTM67VS"
	digest := sha256.Sum256([]byte(timestamp + "\n" + headerNonce + "\n" + string(body) + "\n"))
	signature, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	require.NoError(t, err)
	return callback{header: http.Header{
		"Content-Type":             {"application/json"},
		"Wechatpay-Timestamp":      {timestamp},
		"Wechatpay-Nonce":          {headerNonce},
		"Wechatpay-Signature":      {base64.StdEncoding.EncodeToString(signature)},
		"Wechatpay-Serial":         {testWechatSerial},
		"Wechatpay-Signature-Type": {"WECHATPAY2-SHA256-RSA2048"},
	}, body: body}
}

// The server's payment webhook, mounted as run mounts it, passes the
// payment events' part of the front-end conformance suite on PostgreSQL
// (package payment runs it on MariaDB), WeChat Pay's callbacks signed and
// encrypted as WeChat Pay does.
func TestFrontend_PaymentWebhook(t *testing.T) {
	t.Parallel()
	frontendtest.ExercisePayments(t, pgtest.Database, func(t *testing.T, env *frontendtest.Env) frontendtest.PaymentFrontend {
		provider := frontendtest.NewWeChatPay(t)
		mux := routes(http.NotFoundHandler(), env.Service)
		hooks := []webhookRoute{{"POST /webhooks/wechatpay", provider.Verifier(t)}}
		require.NoError(t, mountWebhooks(mux, env.Service, hooks, slog.New(slog.DiscardHandler)))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return provider.Webhook(srv.URL + "/webhooks/wechatpay")
	})
}
