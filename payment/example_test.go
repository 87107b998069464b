package payment_test

import (
	"crypto/rand"
	"crypto/rsa"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/alipay"
)

// Alipay's asynchronous notifications on one route: each verified
// notification is an action under its notify_id, applied to its order in
// the record's transaction, and answered "success" only once that
// committed, so Alipay stops re-sending exactly then; a re-sent one is
// answered "success" again without being applied twice. The signature is
// checked over the raw body before anything is parsed or written, so a
// forged notification is refused here without a database. Stripe's and
// the Standard Webhooks' verifiers are the modules payment/stripe and
// payment/standard; WeChat Pay's is payment/wechatpay.
func ExampleNewWebhook() {
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	// Its own Middleware: a payment event is no HTTP route's action.
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Route: "payment_events"})
	if err != nil {
		log.Fatal(err)
	}
	// In a service: alipay.ParsePublicKey of the key Alipay's console shows.
	alipayKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		log.Fatal(err)
	}
	verifier, err := alipay.New(alipay.Config{PublicKey: &alipayKey.PublicKey, AppID: "2021000000000001"})
	if err != nil {
		log.Fatal(err)
	}
	hook, err := payment.NewWebhook(payment.Config{
		Verifier:   verifier,
		Middleware: mw,
		Orders:     idempotency.MySQLOrders,
		DB:         db,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/alipay", hook)

	forged := "notify_id=n-1&app_id=2021000000000001&out_trade_no=O-1&trade_status=TRADE_SUCCESS&total_amount=10.00&sign_type=RSA2&sign=Zm9yZ2Vk"
	req := httptest.NewRequest(http.MethodPost, "/webhooks/alipay", strings.NewReader(forged))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))
	// Output:
	// 400 fail
}
