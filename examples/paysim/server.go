package main

import (
	"context"
	"crypto/rsa"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/alipay"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	idemstripe "github.com/orderguard/idempotency/payment/stripe"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

// target is a server the providers play against: the example service
// (in-process or running elsewhere) or the naive handler.
type target struct {
	// Name is the table row's name.
	Name string
	// URL is the server's base URL.
	URL string
	// DB is the server's database, where double applications and applied
	// forgeries are counted; nil when the simulator cannot read it (a
	// remote server without -db).
	DB *sql.DB
	// Orders is the order store's SQL in DB's dialect (ListAnomalies).
	Orders idempotency.Orders
	// naive is the naive handler of the naive target, nil otherwise.
	naive *naiveWebhook

	srv *http.Server
}

// expectConcurrent tells the naive handler that two deliveries of the event
// are on their way at once, so that its barrier holds the first after its
// look-up until the second has looked up too. The example service needs no
// help: its protocol decides, whatever the interleaving.
func (t *target) expectConcurrent(provider, eventID string) {
	if t.naive != nil {
		t.naive.barrier.expect(provider + "/" + eventID)
	}
}

func (t *target) close() {
	if t.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = t.srv.Shutdown(ctx)
	}
}

// ordersOf returns the order store's SQL of a dialect as dburl names it.
func ordersOf(dialect string) (idempotency.Orders, error) {
	switch dialect {
	case "mysql":
		return idempotency.MySQLOrders, nil
	case "sqlite":
		return idempotency.SQLiteOrders, nil
	case "postgres":
		return idempotency.PostgresOrders, nil
	}
	return idempotency.Orders{}, fmt.Errorf("unknown dialect %q", dialect)
}

// verifier returns the verifier the server holds for p: p's secret.
func verifier(p *provider) (payment.Verifier, error) {
	switch p.Name {
	case idemstandard.Provider:
		return idemstandard.New(idemstandard.Config{Secrets: []string{p.Secret}})
	case idemstripe.Provider:
		return idemstripe.New(idemstripe.Config{Secrets: []string{p.Secret}})
	case alipay.Provider:
		k := p.key.(alipayKey)
		return alipay.New(alipay.Config{PublicKey: &k.private.PublicKey, AppID: k.appID, SellerID: k.sellerID})
	case wechatpay.Provider:
		k := p.key.(wechatpayKey)
		return wechatpay.New(wechatpay.Config{PlatformKeys: map[string]*rsa.PublicKey{k.serial: &k.private.PublicKey}, APIv3Key: k.apiV3Key})
	}
	return nil, fmt.Errorf("no verifier for provider %q", p.Name)
}

// startProtected serves the example order service on db (which it
// migrates) with a webhook per provider, as examples/server mounts them:
// svc.PaymentWebhook on POST /webhooks/<provider>.
func startProtected(ctx context.Context, db *sql.DB, store idempotency.Store, dialect string, providers []*provider) (*target, error) {
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		return nil, fmt.Errorf("setup %s: %w", dialect, err)
	}
	svc, err := orderservice.New(db, orderservice.Options{Idempotency: true, Store: store, Dialect: dialect})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", svc)
	for _, p := range providers {
		v, err := verifier(p)
		if err != nil {
			return nil, err
		}
		wh, err := svc.PaymentWebhook(v, nil)
		if err != nil {
			return nil, err
		}
		mux.Handle("POST "+p.Path, wh)
	}
	orders, err := ordersOf(dialect)
	if err != nil {
		return nil, err
	}
	t := &target{Name: protectedName, DB: db, Orders: orders}
	return t, t.serve(mux)
}

// startNaive serves the naive target on db: the example service without
// the idempotency protocol for the order routes, and the naive webhook
// handler (naive.go) per provider.
func startNaive(ctx context.Context, db *sql.DB, dialect string, providers []*provider) (*target, error) {
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		return nil, fmt.Errorf("setup %s: %w", dialect, err)
	}
	if err := setupNaive(ctx, db); err != nil {
		return nil, err
	}
	svc, err := orderservice.New(db, orderservice.Options{Dialect: dialect})
	if err != nil {
		return nil, err
	}
	nw := &naiveWebhook{db: db, dialect: dialect, barrier: newPairBarrier(), verifiers: map[string]payment.Verifier{}}
	mux := http.NewServeMux()
	mux.Handle("/", svc)
	for _, p := range providers {
		v, err := verifier(p)
		if err != nil {
			return nil, err
		}
		nw.verifiers[p.Path] = v
		mux.Handle("POST "+p.Path, nw)
	}
	t := &target{Name: naiveName, DB: db, naive: nw}
	return t, t.serve(mux)
}

// serve serves h on a real loopback listener, as a provider meets a
// server.
func (t *target) serve(h http.Handler) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	t.URL = "http://" + ln.Addr().String()
	t.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		if err := t.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("paysim: %s: %v", t.Name, err)
		}
	}()
	return nil
}
