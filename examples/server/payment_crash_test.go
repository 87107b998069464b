package main

// Crash safety of payment callbacks, with the real server binary and a real
// database (crash_test.go's harness): the server is killed -9 while it
// applies a provider's event, and the provider's redelivery of the same
// signed event is applied exactly once, then answered with the provider's
// success answer, which ends its retries.

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/examples/orderservice"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
)

// paymentCrashCase is a crash point the payment path passes, in one mode.
// in-handler and during-release are create-order points (the order
// handler's AfterCreate hook, a failing handler): a payment event never
// reaches them. Single-phase never claims, so after-claim is claim-first's
// only.
type paymentCrashCase struct {
	mode, point string
	// committed: the crash comes after the effect and its record committed
	// (the provider's success answer was not written); otherwise it rolls
	// the effect back.
	committed bool
}

var paymentCrashCases = []paymentCrashCase{
	{mode: "claim-first", point: crashAfterClaim},
	{mode: "claim-first", point: crashDuringFinalize},
	{mode: "claim-first", point: crashAfterCommit, committed: true},
	{mode: "single-phase", point: crashDuringFinalize},
	{mode: "single-phase", point: crashAfterCommit, committed: true},
}

// TestPaymentCallbackCrash_Kill9WhileApplyingThenProviderRetry_AppliedExactlyOnceAnd204
// creates an order, kills the server -9 at a crash point of the payment
// path while it applies the order's payment.succeeded (Standard Webhooks),
// restarts it and delivers the same signed event again, as the provider
// retries: the retry is answered 204 within one lease plus one reconcile
// interval of the restart's readiness, the payment is applied once, and a
// further delivery changes nothing.
func TestPaymentCallbackCrash_Kill9WhileApplyingThenProviderRetry_AppliedExactlyOnceAnd204(t *testing.T) {
	testPaymentCallbackCrash(t, crashMySQL)
}

func TestPostgres_PaymentCallbackCrash_Kill9WhileApplyingThenProviderRetry_AppliedExactlyOnceAnd204(t *testing.T) {
	testPaymentCallbackCrash(t, crashPostgres)
}

func testPaymentCallbackCrash(t *testing.T, open crashDatabase) {
	var (
		mu      sync.Mutex
		results []string
	)
	t.Cleanup(func() {
		slices.Sort(results)
		t.Logf("payment crash results (bound %v):\n  %s", crashTestAnswerBound, strings.Join(results, "\n  "))
	})
	for _, tc := range paymentCrashCases {
		t.Run(tc.mode+"/"+tc.point, func(t *testing.T) {
			t.Parallel()
			db, dbURL := open(t)
			srv := newCrashServer(t, dbURL, tc.mode, "-payment-mode", tc.mode, "-webhook-secret", testStandardSecret)
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

			// 1. An order, created by a server without a crash point, which
			// then stops.
			first := srv.start("")
			create := crashCreate{user: 7, key: "order-1", body: []byte(`{"user_id":7,"sku_id":20001,"quantity":1}`)}
			created := create.send(client, srv.url("/orders"))
			require.NoError(t, created.err)
			require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
			var order orderservice.OrderResponse
			require.NoError(t, json.Unmarshal(created.body, &order))
			srv.stop(first)
			unpaid := paymentLedger{
				Orders:  map[string]string{order.OrderNo: "CREATED"},
				Records: map[string]int{"DONE": 1},
			}
			require.Equal(t, unpaid, readPaymentLedger(t, db), "after the create")

			// 2. The event, delivered to a server armed with the crash
			// point: it dies, and the provider sees a transport error.
			paymentID := "pay_" + strings.ToLower(order.OrderNo)
			eventID := "msg_" + paymentID
			event := standardCallback(t, testStandardSecret, eventID, fmt.Sprintf(`{"type":"payment.succeeded","timestamp":"2025-03-14T09:26:53Z",`+
				`"data":{"order_no":"%s","payment_id":"%s","amount":%d,"currency":"CNY"}}`, order.OrderNo, paymentID, order.TotalCents))
			webhook := srv.url("/webhooks/standard")
			armed := srv.start(tc.point)
			crashed := deliverCallback(client, webhook, event)
			require.True(t, srv.waitExit(armed, 5*time.Second),
				"%s: the server must SIGKILL itself while applying the event, but it is alive; the provider got %s %q", tc.point, crashed, crashed.body)
			require.True(t, armed.killedBySIGKILL(), "want the server killed by SIGKILL, Wait returned %v", armed.waitErr)
			require.Error(t, crashed.err, "the provider of a crashed delivery must see a transport error, got %d %q", crashed.status, crashed.body)
			paid := paymentLedger{
				Orders:   map[string]string{order.OrderNo: "PAID"},
				Payments: []string{idemstandard.Provider + "/" + paymentID + " order=" + order.OrderNo + " SUCCEEDED events_applied=1"},
				Events:   []string{idemstandard.Provider + "/" + eventID + " APPLIED"},
				Records:  map[string]int{"DONE": 2},
			}
			left := readPaymentLedger(t, db)
			if tc.committed {
				require.Equal(t, paid, left, "%s: the effect and its record are committed before the answer", tc.point)
			} else {
				// Nothing of the event is committed; a claim-first crash
				// leaves the event's claim, which a lease or the
				// reconciler ends.
				require.Equal(t, unpaid.Orders, left.Orders, "%s: the crash rolls the payment back", tc.point)
				require.Empty(t, left.Payments, "%s: the crash rolls the payment back", tc.point)
				require.Empty(t, left.Events, "%s: the crash rolls the payment back", tc.point)
				require.Equal(t, 1, left.Records["DONE"], "%s: only the create's record is DONE", tc.point)
			}

			// 3. The provider delivers the same signed event again, to the
			// restarted server, until it gets an answer that is not a
			// transport error or a 5xx (503 while the crashed claim's lease
			// runs).
			second := srv.start("")
			deadline := second.ready.Add(crashTestAnswerBound + 5*time.Second)
			var (
				retry   crashAnswer
				interim = map[string]int{}
			)
			for {
				retry = deliverCallback(client, webhook, event)
				if retry.err == nil && retry.status < 500 {
					break
				}
				interim[retry.String()]++
				require.True(t, time.Now().Before(deadline), "the redelivery got no final answer %v after the restart; answers seen: %v",
					crashTestAnswerBound+5*time.Second, interim)
				time.Sleep(50 * time.Millisecond)
			}
			sinceReady := time.Since(second.ready)
			mu.Lock()
			results = append(results, fmt.Sprintf("%-12s %-15s retry=%d answered %5dms after ready, interim %v",
				tc.mode, tc.point, retry.status, sinceReady.Milliseconds(), interim))
			mu.Unlock()
			require.Equal(t, http.StatusNoContent, retry.status, "the provider's success answer to the redelivery; body %q", retry.body)
			require.Empty(t, retry.body)
			require.LessOrEqual(t, sinceReady, crashTestAnswerBound,
				"time from the restarted server's readiness to the provider's success answer must be at most lease + reconcile interval + slack")

			// 4. Applied exactly once: the order PAID, one application of
			// the payment, one row for the event.
			require.Equal(t, paid, readPaymentLedger(t, db), "after the redelivery")

			// And once more, as a provider that missed the answer would.
			again := deliverCallback(client, webhook, event)
			require.NoError(t, again.err)
			require.Equal(t, http.StatusNoContent, again.status, "a further delivery; body %q", again.body)
			require.Equal(t, paid, readPaymentLedger(t, db), "after a further delivery")
			require.False(t, second.exited(), "the restarted server must stay up: %v", second.waitErr)
		})
	}
}

// stop ends p as an operator does (SIGTERM: the server shuts down) and
// waits for it to exit cleanly.
func (s *crashServer) stop(p *crashProc) {
	s.t.Helper()
	require.NoError(s.t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.True(s.t, s.waitExit(p, 15*time.Second), "the server did not stop within 15s of SIGTERM")
	require.NoError(s.t, p.waitErr, "the server's exit after SIGTERM")
}

// deliverCallback posts cb to url once, as the provider does.
func deliverCallback(client *http.Client, url string, cb callback) crashAnswer {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(cb.body)))
	if err != nil {
		return crashAnswer{err: err}
	}
	for k, v := range cb.header {
		req.Header[k] = v
	}
	return exchange(client, req)
}

// paymentLedger is the payment state of a test's own database, whole
// tables, each row written so that a failure shows what differs.
type paymentLedger struct {
	Orders   map[string]string // purchase_order: order_no → status
	Payments []string          // order_payment: "provider/payment_id order=… STATUS events_applied=N"
	Events   []string          // payment_event: "provider/event_id OUTCOME"
	Records  map[string]int    // idempotency_record: status → count
}

func readPaymentLedger(t *testing.T, db *sql.DB) paymentLedger {
	t.Helper()
	l := paymentLedger{Orders: map[string]string{}, Records: crashRecordStatuses(t, db)}
	each := func(query string, row func(*sql.Rows) error) {
		rows, err := db.Query(query)
		require.NoError(t, err, query)
		defer rows.Close()
		for rows.Next() {
			require.NoError(t, row(rows), query)
		}
		require.NoError(t, rows.Err(), query)
	}
	each(`SELECT order_no, status FROM purchase_order`, func(rows *sql.Rows) error {
		var orderNo, status string
		err := rows.Scan(&orderNo, &status)
		l.Orders[orderNo] = status
		return err
	})
	each(`SELECT provider, payment_id, order_no, status, events_applied FROM order_payment ORDER BY provider, payment_id`, func(rows *sql.Rows) error {
		var provider, paymentID []byte
		var orderNo sql.NullString
		var status string
		var applied int
		err := rows.Scan(&provider, &paymentID, &orderNo, &status, &applied)
		l.Payments = append(l.Payments, fmt.Sprintf("%s/%s order=%s %s events_applied=%d", provider, paymentID, orderNo.String, status, applied))
		return err
	})
	each(`SELECT provider, event_id, outcome FROM payment_event ORDER BY provider, event_id`, func(rows *sql.Rows) error {
		var provider, eventID []byte
		var outcome string
		err := rows.Scan(&provider, &eventID, &outcome)
		l.Events = append(l.Events, fmt.Sprintf("%s/%s %s", provider, eventID, outcome))
		return err
	})
	return l
}
