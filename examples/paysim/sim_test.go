package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/payment"
)

// testConfig is a small run in which every scenario occurs: dense rates,
// the retry schedule compressed to milliseconds.
func testConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Orders = 40
	cfg.Concurrency = 8
	cfg.Seed = 3
	cfg.ConcurrentRate = 0.4
	cfg.RefundFirstRate = 0.5
	cfg.CancelRate = 0.3
	cfg.ForgeRate = 0.5
	cfg.StaleRate = 0.3
	cfg.LostAnswerRate = 0.15
	cfg.Tries = 8
	cfg.RetryBase = 2 * time.Millisecond
	cfg.Providers = testProviders(t)
	return cfg
}

func testProviders(t *testing.T) []*provider {
	t.Helper()
	var ps []*provider
	for _, name := range providerNames {
		var key any
		switch name {
		case "standard":
			key = NewStandardSecret()
		case "stripe":
			key = NewStripeSecret()
		case "alipay":
			key = alipayKey{testRSAKey(t), defaultAlipayAppID, defaultAlipaySellerID}
		case "wechatpay":
			key = wechatpayKey{testRSAKey(t), defaultWechatpaySerial, "an APIv3 key of 32 bytes, paysim"}
		default:
			t.Fatalf("no test key for provider %q", name)
		}
		p, err := newProvider(name, key)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func testRSAKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type testBundle struct {
	cfg    Config
	target *target
}

// setup serves the protected example service, or the naive handler, on a
// fresh MariaDB/MySQL database of its own.
func setup(t *testing.T, naive bool) *testBundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	cfg := testConfig(t)
	ctx := context.Background()
	var tgt *target
	var err error
	if naive {
		tgt, err = startNaive(ctx, db, "mysql", cfg.Providers)
	} else {
		tgt, err = startProtected(ctx, db, idempotency.NewMySQLStore(db), "mysql", cfg.Providers)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tgt.close)
	return &testBundle{cfg: cfg, target: tgt}
}

func TestSimulation_ExampleService_AppliesEveryEventOnceAndRefusesForgeries(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	res, err := Run(context.Background(), b.cfg, b.target)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", Table([]*Result{res}))
	if res.Counted != "database" {
		t.Fatal("the database was not counted")
	}
	if res.DoubleApplications != 0 {
		t.Errorf("%d double applications, want 0", res.DoubleApplications)
	}
	if res.ForgeriesAccepted != 0 {
		t.Errorf("%d of %d forgeries accepted, want 0", res.ForgeriesAccepted, sum(res.Forged))
	}
	if res.Unexpected != 0 {
		t.Errorf("%d orders are not in the state their acknowledged facts make them", res.Unexpected)
	}
	if res.Unacked != 0 {
		t.Errorf("%d events never acknowledged within %d tries", res.Unacked, b.cfg.Tries)
	}
	// The scenarios ran: otherwise the zeros above say nothing.
	for what, n := range map[string]int64{
		"concurrent pairs": res.Concurrent, "refunds before success": res.RefundFirst, "cancel races": res.CancelRaces,
		"redeliveries": res.Duplicates, "retries": res.Retries, "lost answers": res.LostAnswers,
		"forgeries": sum(res.Forged), "stale callbacks": res.Forged[forgeStale],
		"callbacks of another merchant": res.Forged[forgeForeign],
	} {
		if n == 0 {
			t.Errorf("no %s: the scenario did not run", what)
		}
	}
	if res.States["PAID"] == 0 || res.States["REFUNDED"] == 0 {
		t.Errorf("states %v: want PAID and REFUNDED orders", res.States)
	}
	if res.Answers[http.StatusBadRequest] != sum(res.Forged) {
		t.Errorf("%d answers 400 for %d forged callbacks", res.Answers[http.StatusBadRequest], sum(res.Forged))
	}
	// Every provider was played, and its events applied.
	paid := map[string]int{}
	rows, err := b.target.DB.Query(`SELECT provider, COUNT(*) FROM order_payment WHERE status = 'SUCCEEDED' GROUP BY provider`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var provider string
		var n int
		if err := rows.Scan(&provider, &n); err != nil {
			t.Fatal(err)
		}
		paid[provider] = n
	}
	for _, name := range providerNames {
		if paid[name] == 0 {
			t.Errorf("no payment of %s applied: %v", name, paid)
		}
	}
}

func TestSimulation_Naive_AppliesConcurrentDuplicatesTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	res, err := Run(context.Background(), b.cfg, b.target)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", Table([]*Result{res}))
	if res.Concurrent == 0 {
		t.Fatal("no concurrent pairs: the race was not played")
	}
	// The barrier lets both deliveries of every pair pass the look-up
	// before either inserts: each pair is applied twice.
	if int64(res.DoubleApplications) < res.Concurrent {
		t.Errorf("%d double applications for %d concurrent pairs, want at least one per pair", res.DoubleApplications, res.Concurrent)
	}
	if res.ForgeriesAccepted != 0 {
		t.Errorf("%d forgeries accepted: the naive handler verifies signatures as the library does", res.ForgeriesAccepted)
	}
}

// The detector must catch a breach: a payment row that counts one more
// event applied than the simulator sent is a double application, and so
// is a refunded amount above the refunds sent.
func TestCount_PlantedDoubleApplication_IsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.cfg.Orders = 6
	b.cfg.RefundRate = 1
	b.cfg.FullRefundRate = 0
	b.cfg.ForgeRate, b.cfg.StaleRate, b.cfg.CancelRate = 0, 0, 0
	ctx := context.Background()
	if _, err := Run(ctx, b.cfg, b.target); err != nil {
		t.Fatal(err)
	}
	db := b.target.DB
	var first, second string
	rows, err := db.QueryContext(ctx, `SELECT payment_id FROM order_payment WHERE status = 'SUCCEEDED' ORDER BY payment_id LIMIT 2`)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*string{&first, &second} {
		if !rows.Next() {
			t.Fatal("fewer than two settled payments")
		}
		if err := rows.Scan(p); err != nil {
			t.Fatal(err)
		}
	}
	rows.Close()
	// A refund applied twice: the counter and the money both grow.
	if _, err := db.ExecContext(ctx, `UPDATE order_payment SET events_applied = events_applied + 1, refunded_cents = refunded_cents * 2 WHERE payment_id = ?`, first); err != nil {
		t.Fatal(err)
	}
	// Only the money: the refund's second application not counted.
	if _, err := db.ExecContext(ctx, `UPDATE order_payment SET refunded_cents = refunded_cents + 1 WHERE payment_id = ?`, second); err != nil {
		t.Fatal(err)
	}
	r := runnerOf(t, b, ctx)
	res := &Result{}
	if err := r.count(ctx, res); err != nil {
		t.Fatal(err)
	}
	if res.DoubleApplications != 2 {
		t.Errorf("%d double applications counted, want 2", res.DoubleApplications)
	}
}

// runnerOf plays one order per payment the database holds, so that count
// has the truth of the planted run: a fresh Run with the same seed on the
// same target would add payments of its own, so the truth is read back
// from payment_event instead.
func runnerOf(t *testing.T, b *testBundle, ctx context.Context) *runner {
	t.Helper()
	r := &runner{cfg: b.cfg, t: b.target, payments: map[string]*truth{}, facts: map[string]*facts{}, forgedOK: map[string]bool{}, forgedIDs: map[string]bool{}}
	rows, err := b.target.DB.QueryContext(ctx, `SELECT provider, event_id, payment_id, kind, amount_cents FROM payment_event`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var provider, id, paymentID, kind string
		var amount int64
		if err := rows.Scan(&provider, &id, &paymentID, &kind, &amount); err != nil {
			t.Fatal(err)
		}
		r.run = strings.Split(id, "_")[1]
		tr := r.payments[provider+"/"+paymentID]
		if tr == nil {
			tr = &truth{provider: provider, paymentID: paymentID, events: map[string]bool{}}
			r.payments[provider+"/"+paymentID] = tr
		}
		tr.events[id] = true
		if kind != string(idempotency.PaymentSucceeded) {
			tr.refunds += amount
		}
	}
	return r
}

// What the simulator sends is what the providers' verifiers accept, and
// reads back as the event it meant.
func TestProviders_SignedEvents_VerifyAsTheEventsSent(t *testing.T) {
	t.Parallel()
	at := time.Now().Truncate(time.Second)
	for _, p := range testProviders(t) {
		v, err := verifier(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range []event{
			{ID: "evt_1", Kind: kindSuccess, OrderNo: "O1", PaymentID: "pi_1", Amount: 1999, Currency: "CNY", At: at, Total: 1999},
			{ID: "evt_2", Kind: kindRefund, OrderNo: "O1", PaymentID: "pi_1", RefundID: "re_1", Amount: 500, Currency: "CNY", At: at, Total: 1999, Refunded: 500},
		} {
			t.Run(p.Name+"/"+string(ev.Kind), func(t *testing.T) {
				h, body, err := p.sign(ev, p.body(ev), at)
				if err != nil {
					t.Fatal(err)
				}
				got, err := v.Verify(h, body, at)
				if err != nil {
					t.Fatalf("Verify: %v\n%s", err, body)
				}
				wantKind := payment.Succeeded
				if ev.Kind == kindRefund {
					wantKind = payment.Refunded
				}
				wantRefundID := ev.RefundID
				if p.Name == "alipay" {
					wantRefundID = "" // refund_fee is the trade's refunded total
				}
				if got.ID != ev.ID || got.Kind != wantKind || got.OrderNo != ev.OrderNo || got.PaymentID != ev.PaymentID ||
					got.RefundID != wantRefundID || got.Amount != ev.Amount || got.Currency != ev.Currency {
					t.Errorf("read %+v from %+v", got, ev)
				}
				// The same body signed with a secret the server does not
				// hold, or 10 minutes ago, is refused.
				h, body, _ = p.signAsStranger(ev, p.body(ev), at)
				if _, err := v.Verify(h, body, at); !errors.Is(err, payment.ErrSignature) {
					t.Errorf("stranger's signature: %v, want ErrSignature", err)
				}
				if !p.signsTime {
					return
				}
				h, body, _ = p.sign(ev, p.body(ev), at.Add(-10*time.Minute))
				if _, err := v.Verify(h, body, at); !errors.Is(err, payment.ErrStale) {
					t.Errorf("stale signature: %v, want ErrStale", err)
				}
			})
		}
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(stderr.String(), "Needs: nothing by default") || !strings.Contains(stderr.String(), "-server") {
		t.Errorf("-h does not say what must run:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "\nOther:\n") {
		t.Errorf("-h lists flags in no group of help:\n%s", stderr.String())
	}
	if _, err := parseFlags([]string{"-server", "http://127.0.0.1:1", "-providers", "standard"}, &stderr); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Errorf("-server without secrets: %v, want an error naming the secret", err)
	}
	o, err := parseFlags([]string{"-server", "http://127.0.0.1:1", "-providers", "stripe", "-stripe-webhook-secret", "whsec_x", "-orders", "7"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Providers) != 1 || o.Providers[0].Secret != "whsec_x" || o.Orders != 7 {
		t.Errorf("flags = %+v", o)
	}
	if _, err := parseFlags([]string{"-providers", "paypal"}, &stderr); err == nil {
		t.Error("-providers paypal accepted")
	}
	if _, err := parseFlags([]string{"-forge-rate", "2"}, &stderr); err == nil {
		t.Error("-forge-rate 2 accepted")
	}
	// WeChat Pay against a server needs the server's APIv3 key; one of
	// another length is refused, never shown.
	if _, err := parseFlags([]string{"-server", "http://127.0.0.1:1", "-providers", "wechatpay", "-wechatpay-private-key", "x.pem"}, &stderr); err == nil {
		t.Error("-server with wechatpay and no key file accepted")
	}
	if _, err := parseFlags([]string{"-providers", "wechatpay", "-wechatpay-apiv3-key", "short-secret"}, &stderr); err == nil ||
		!strings.Contains(err.Error(), "-wechatpay-apiv3-key") || strings.Contains(err.Error(), "short-secret") {
		t.Errorf("-wechatpay-apiv3-key of 12 bytes: %v, want an error naming the flag, not the key", err)
	}
	o, err = parseFlags([]string{"-providers", "alipay,wechatpay", "-alipay-app-id", "2021000000000009", "-alipay-seller-id", "", "-wechatpay-serial", "PUB_KEY_ID_9"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if k := o.Providers[0].key.(alipayKey); k.appID != "2021000000000009" || k.sellerID != "" {
		t.Errorf("alipay key = %+v", k)
	}
	if k := o.Providers[1].key.(wechatpayKey); k.serial != "PUB_KEY_ID_9" || len(k.apiV3Key) != 32 {
		t.Errorf("wechatpay key: serial %q, APIv3 key of %d bytes", k.serial, len(k.apiV3Key))
	}
}

// -server plays against a running server with its secrets: counted from
// its database with -db, from GET /orders' refunded_cents without.
func TestRun_AgainstARunningServer(t *testing.T) {
	t.Parallel()
	db, dsn := testdb.MySQL(t)
	providers := testProviders(t)
	srv, err := startProtected(context.Background(), db, idempotency.NewMySQLStore(db), "mysql", providers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.close)
	keyFile := func(key *rsa.PrivateKey) string {
		file := filepath.Join(t.TempDir(), "key.pem")
		der := x509.MarshalPKCS1PrivateKey(key)
		if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	ali, wechat := providers[2].key.(alipayKey), providers[3].key.(wechatpayKey)
	base := []string{"-server", srv.URL, "-orders", "12", "-retry-base", "2ms", "-tries", "8",
		"-webhook-secret", providers[0].Secret, "-stripe-webhook-secret", providers[1].Secret,
		"-alipay-private-key", keyFile(ali.private), "-alipay-app-id", ali.appID, "-alipay-seller-id", ali.sellerID,
		"-wechatpay-private-key", keyFile(wechat.private), "-wechatpay-serial", wechat.serial, "-wechatpay-apiv3-key", wechat.apiV3Key}
	for _, tc := range []struct {
		name          string
		args          []string
		counted, lack string
	}{
		{"with -db", []string{"-db", "mysql://" + dsn}, "| 0 | 0 of", "GET /orders"},
		{"without -db", nil, "| 0 (GET /orders) |", "not counted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), append(base, tc.args...), &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\n%s", err, stderr.String())
			}
			out := stdout.String()
			if !strings.Contains(out, "example server at "+srv.URL) || !strings.Contains(out, tc.counted) || strings.Contains(out, tc.lack) {
				t.Errorf("want the server's row with %q and without %q:\n%s", tc.counted, tc.lack, out)
			}
		})
	}
}
