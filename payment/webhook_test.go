package payment_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/alipay"
)

// The webhook front-end, with Alipay's verifier over a real MariaDB:
// every delivery of a verified event is acknowledged, and the event has
// exactly one effect; a forged one is refused and writes nothing.

var (
	alipayKeyOnce sync.Once
	alipayKey     *rsa.PrivateKey
)

// testKey is Alipay's key pair as the tests play Alipay.
func testKey(t *testing.T) *rsa.PrivateKey {
	alipayKeyOnce.Do(func() {
		var err error
		alipayKey, err = rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
	})
	return alipayKey
}

// notify is an Alipay async notification signed as Alipay documents it:
// every parameter but sign and sign_type, sorted, name=value joined by
// '&', SHA256withRSA, base64.
func notify(t *testing.T, params map[string]string) []byte {
	t.Helper()
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	pairs := make([]string, len(names))
	for i, k := range names {
		pairs[i] = k + "=" + params[k]
	}
	digest := sha256.Sum256([]byte(strings.Join(pairs, "&")))
	sig, err := rsa.SignPKCS1v15(rand.Reader, testKey(t), crypto.SHA256, digest[:])
	require.NoError(t, err)
	form := url.Values{}
	for k, v := range params {
		form.Set(k, v)
	}
	form.Set("sign", base64.StdEncoding.EncodeToString(sig))
	form.Set("sign_type", "RSA2")
	return []byte(form.Encode())
}

// The merchant the webhook serves: its app and its seller (PID).
const (
	testAppID    = "2021000117650001"
	testSellerID = "2088102119685838"
)

// paid is the notification that order orderNo was paid yuan.
func paid(notifyID, orderNo, yuan string) map[string]string {
	return map[string]string{
		"notify_id": notifyID, "notify_time": "2026-12-04 10:00:00", "notify_type": "trade_status_sync",
		"app_id": testAppID, "seller_id": testSellerID, "charset": "utf-8", "version": "1.0",
		"trade_no": "T-" + orderNo, "out_trade_no": orderNo, "trade_status": "TRADE_SUCCESS", "total_amount": yuan,
	}
}

type webhookBundle struct {
	db   *sql.DB
	srv  *httptest.Server
	mu   sync.Mutex
	seen []payment.Observation
}

func setupWebhook(t *testing.T, store idempotency.Store) *webhookBundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	if store == nil {
		store = idempotency.NewMySQLStore(db)
	}
	mw, err := idempotency.New(store, &idempotency.Config{Route: "alipay_events"})
	require.NoError(t, err)
	v, err := alipay.New(alipay.Config{PublicKey: &testKey(t).PublicKey, AppID: testAppID, SellerID: testSellerID})
	require.NoError(t, err)
	b := &webhookBundle{db: db}
	h, err := payment.NewWebhook(payment.Config{Verifier: v, Middleware: mw, Orders: idempotency.MySQLOrders, DB: db,
		Observe: func(o payment.Observation) { b.mu.Lock(); b.seen = append(b.seen, o); b.mu.Unlock() }})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *webhookBundle) order(t *testing.T, orderNo string, totalCents int64) {
	t.Helper()
	tx, err := b.db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.MySQLOrders.Create(context.Background(), tx, &idempotency.Order{
		OrderNo: orderNo, Scope: "7", UserID: 7, SKUID: 1, Quantity: 1, UnitPriceCents: totalCents,
		TotalCents: totalCents, Status: idempotency.OrderCreated, Currency: "CNY",
	}))
	require.NoError(t, tx.Commit())
}

// deliver posts a notification as Alipay does and returns the status and
// body.
func (b *webhookBundle) deliver(t *testing.T, body []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(b.srv.URL, "application/x-www-form-urlencoded", strings.NewReader(string(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(answer)
}

func (b *webhookBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(query, args...).Scan(&n))
	return n
}

func (b *webhookBundle) status(t *testing.T, orderNo string) idempotency.OrderStatus {
	t.Helper()
	o, err := idempotency.MySQLOrders.Get(context.Background(), b.db, orderNo)
	require.NoError(t, err)
	return o.Status
}

func TestWebhook_VerifiedEvent_AppliedOnceAndEveryDeliveryAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-1", 1234)
	body := notify(t, paid("N-1", "O-1", "12.34"))

	status, answer := b.deliver(t, body)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "success", answer, "Alipay stops delivering on the body success")
	require.Equal(t, idempotency.OrderPaid, b.status(t, "O-1"))

	// Alipay delivers again (its acknowledgement lost), the same notice
	// sent anew hours later.
	again := paid("N-1", "O-1", "12.34")
	again["notify_time"] = "2026-12-04 13:00:00"
	status, answer = b.deliver(t, notify(t, again))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "success", answer)
	p, err := idempotency.MySQLOrders.GetPayment(context.Background(), b.db, "alipay", "T-O-1")
	require.NoError(t, err)
	require.Equal(t, 1, p.EventsApplied, "applied once")
	require.True(t, b.seen[1].Replayed, "the redelivery is answered from the record")
}

func TestWebhook_ConcurrentDeliveries_OneApplication(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-2", 500)
	body := notify(t, paid("N-2", "O-2", "5.00"))
	const n = 8
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			<-start
			// A provider retries anything but its success answer.
			for range 50 {
				if statuses[i], _ = b.deliver(t, body); statuses[i] == http.StatusOK {
					return
				}
				time.Sleep(20 * time.Millisecond) // the provider's retry schedule, compressed
			}
		})
	}
	close(start)
	wg.Wait()
	for i, s := range statuses {
		require.Equal(t, http.StatusOK, s, "delivery %d was acknowledged in the end", i)
	}
	require.Equal(t, 1, b.count(t, "SELECT events_applied FROM order_payment WHERE payment_id = 'T-O-2'"))
	require.Equal(t, idempotency.OrderPaid, b.status(t, "O-2"))
}

func TestWebhook_Forged_RefusedAndNothingWritten(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-3", 500)
	good := string(notify(t, paid("N-3", "O-3", "5.00")))
	for name, body := range map[string]string{
		"an amount changed": strings.Replace(good, "total_amount=5.00", "total_amount=0.01", 1),
		"unsigned":          "notify_id=N-3&out_trade_no=O-3&trade_status=TRADE_SUCCESS&total_amount=5.00",
		"empty":             "",
	} {
		status, answer := b.deliver(t, []byte(body))
		require.Equal(t, http.StatusBadRequest, status, name)
		require.Equal(t, "fail", answer, name)
	}
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM payment_event"))
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM idempotency_record"))
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-3"))
	for _, o := range b.seen {
		require.ErrorIs(t, o.Refused, payment.ErrSignature)
	}
}

func TestWebhook_EventThatCannotApply_RecordedAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-4", 500)
	for _, tc := range []struct {
		name   string
		params map[string]string
		reason idempotency.AnomalyReason
	}{
		{"unknown order", paid("N-4a", "O-nowhere", "5.00"), idempotency.AnomalyUnknownOrder},
		{"amount other than the order's", paid("N-4b", "O-4", "4.99"), idempotency.AnomalyAmountMismatch},
	} {
		status, answer := b.deliver(t, notify(t, tc.params))
		require.Equal(t, http.StatusOK, status, tc.name)
		require.Equal(t, "success", answer, "%s: a retry cannot fix it", tc.name)
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM payment_anomaly WHERE event_id = ? AND reason = ?",
			tc.params["notify_id"], string(tc.reason)), tc.name)
	}
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-4"))
}

func TestWebhook_SameIDAnotherPayload_NeverAppliedRecordedAsAnomaly(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-5", 500)
	b.order(t, "O-6", 500)
	status, _ := b.deliver(t, notify(t, paid("N-5", "O-5", "5.00")))
	require.Equal(t, http.StatusOK, status)

	status, answer := b.deliver(t, notify(t, paid("N-5", "O-6", "5.00")))
	require.Equal(t, http.StatusOK, status, "acknowledged: no retry can fix it")
	require.Equal(t, "success", answer)
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-6"), "never applied")
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM payment_anomaly WHERE event_id = 'N-5' AND reason = ?",
		string(idempotency.AnomalyPayloadMismatch)))
}

func TestWebhook_DatabaseDown_503SoTheProviderRetries(t *testing.T) {
	t.Parallel()
	testdb.CaptureDriverLog(t) // before the driver is used: it sets the driver's logger
	down, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/test?timeout=1s")
	require.NoError(t, err)
	t.Cleanup(func() { down.Close() })
	b := setupWebhook(t, idempotency.NewMySQLStore(down))
	b.order(t, "O-7", 500)
	status, answer := b.deliver(t, notify(t, paid("N-7", "O-7", "5.00")))
	require.Equal(t, http.StatusServiceUnavailable, status, answer)
	require.Equal(t, "fail", answer)
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-7"))
}

func TestWebhook_IgnoredEvent_AcknowledgedNothingWritten(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	waiting := paid("N-8", "O-8", "5.00")
	waiting["trade_status"] = "WAIT_BUYER_PAY"
	status, answer := b.deliver(t, notify(t, waiting))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "success", answer)
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM idempotency_record"))
}

// A reused id with another payload is never applied, whatever became of
// the first delivery: here the first was an event the store could not hold
// (an amount of zero), which left no payment row behind.
func TestWebhook_SameIDAnotherPayload_AfterAnEventNotHeld_NeverApplied(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-9", 500)
	status, _ := b.deliver(t, notify(t, paid("N-9", "O-9", "0.00")))
	require.Equal(t, http.StatusOK, status, "acknowledged: no redelivery makes it hold")
	require.Equal(t, payment.AnomalyInvalidEvent, b.seen[0].Outcome.Anomaly)

	status, _ = b.deliver(t, notify(t, paid("N-9", "O-9", "5.00")))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-9"), "the other payload is never applied")
	require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM payment_anomaly WHERE event_id = 'N-9' AND reason = ?",
		string(idempotency.AnomalyPayloadMismatch)))
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM order_payment"))
}

// A notification Alipay signed for another app, or for another seller's
// trade, verifies with Alipay's key but is not this merchant's: refused as
// a bad notification ("fail", observed as unverified so that it is
// counted), nothing written, whatever it claims.
func TestWebhook_NotificationOfAnotherMerchant_RefusedAndNothingWritten(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, nil)
	b.order(t, "O-10", 500)
	for name, change := range map[string]map[string]string{
		"another app":    {"app_id": "2021000117659999"},
		"another seller": {"seller_id": "2088102119689999"},
	} {
		params := paid("N-10-"+strings.ReplaceAll(name, " ", "-"), "O-10", "5.00")
		for k, v := range change {
			params[k] = v
		}
		status, answer := b.deliver(t, notify(t, params))
		require.Equal(t, http.StatusBadRequest, status, name)
		require.Equal(t, "fail", answer, name)
	}
	require.Len(t, b.seen, 2)
	require.ErrorIs(t, b.seen[0].Refused, payment.ErrSignature)
	require.ErrorIs(t, b.seen[1].Refused, payment.ErrSignature)
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM idempotency_record"))
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM payment_event"))
	require.Zero(t, b.count(t, "SELECT COUNT(*) FROM payment_anomaly"))
	require.Equal(t, idempotency.OrderCreated, b.status(t, "O-10"))

	status, answer := b.deliver(t, notify(t, paid("N-10", "O-10", "5.00")))
	require.Equal(t, http.StatusOK, status, "this merchant's notification is applied")
	require.Equal(t, "success", answer)
	require.Equal(t, idempotency.OrderPaid, b.status(t, "O-10"))
}
