// Command paysim plays payment providers against the example order service
// as the providers do, and counts what the callbacks did.
//
// It creates orders through the API (POST /orders), then for each order
// plays its provider (Standard Webhooks, Stripe, Alipay and WeChat Pay v3,
// round robin):
// the signed success, refunds (some delivered before their success),
// duplicates (some at the same moment, some later), the provider's retry
// schedule compressed in time (a delivery that is not acknowledged, or whose
// answer is lost on the way back, is delivered again after 10ms, 20ms, 40ms,
// … up to -tries times), the user's cancel racing the success, and forged
// and stale callbacks claiming a full refund (for Alipay, which signs no
// time, notifications Alipay signed for another app), which must be
// refused. It then reads every order back (GET /orders/{no}) and counts
// from the server's database (audit.go): double applications and
// forgeries accepted must both be 0, and every order must be in the state
// its acknowledged events make it.
//
// With -naive it also runs, side by side, the usual deduplicating handler
// (naive.go: look up processed_events, apply, insert processed_events, in
// separate transactions, no unique constraint) over the same kind of
// database, and counts its double applications.
//
//	go run ./examples/paysim                  # in-process service on SQLite in a temp dir
//	go run ./examples/paysim -naive           # and the naive handler beside it
//	go run ./examples/paysim -server http://127.0.0.1:8080 -db sqlite://orders.db \
//	    -webhook-secret whsec_… -stripe-webhook-secret whsec_… \
//	    -alipay-private-key alipay.pem -alipay-app-id APPID [-alipay-seller-id PID] \
//	    -wechatpay-private-key wechatpay.pem -wechatpay-serial SERIAL -wechatpay-apiv3-key KEY
//
// Without -server nothing needs to be running: the example service is
// served in-process on a loopback port (-db picks its database). With
// -server, run examples/server with the matching secrets (see -h).
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/orderguard/idempotency/examples/internal/cli"
	"github.com/orderguard/idempotency/examples/internal/dburl"
	"github.com/orderguard/idempotency/payment/alipay"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	idemstripe "github.com/orderguard/idempotency/payment/stripe"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

// Row names of the table.
const (
	protectedName = "example service (this library)"
	naiveName     = "naive: look up, apply, insert"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the help is printed
		}
		fmt.Fprintln(os.Stderr, "paysim:", err)
		os.Exit(1)
	}
}

// options are the command's flags beyond Config.
type options struct {
	Config
	server    string
	db        string
	naive     bool
	naiveDB   string
	providers string
	secrets   map[string]*string // by provider; Alipay's and WeChat Pay's are key files
}

// help is what -h prints: what the simulator needs running, and its flags.
var help = cli.Help{
	Usage: "go run ./examples/paysim [flags]",
	About: "Plays payment providers (Standard Webhooks, Stripe, Alipay, WeChat Pay v3) against the example order service " +
		"and prints what their callbacks did. Exits 1 if the service applied an event twice, accepted a forgery, " +
		"or left an order off the state its acknowledged events make it.",
	Needs: "nothing by default: the service runs in-process on SQLite in a temporary directory (or on -db). " +
		"With -server URL it plays against a running examples/server instead, which must serve the webhook routes " +
		"with the secrets given here: -webhook-secret, -stripe-webhook-secret, -alipay-private-key (the private half " +
		"of its -alipay-public-key) with its -alipay-app-id (and -alipay-seller-id), and -wechatpay-private-key (the " +
		"private half of its -wechatpay-public-key) with its -wechatpay-serial and -wechatpay-apiv3-key, for the " +
		"providers in -providers. Give -db (the server's own -db) to count double applications and anomalies from its " +
		"database; without it they are counted from GET /orders (refunded_cents).",
	Examples: []string{"go run ./examples/paysim -naive", "go run ./examples/paysim -server http://127.0.0.1:8080 -db sqlite://orders.db -webhook-secret whsec_…"},
	Groups: []cli.Group{
		cli.Flags("Service", "server", "db", "naive", "naive-db", "providers"),
		cli.Flags("Provider secrets (the server's, with -server; fresh ones in-process)",
			"webhook-secret", "stripe-webhook-secret", "alipay-private-key", "alipay-app-id", "alipay-seller-id",
			"wechatpay-private-key", "wechatpay-serial", "wechatpay-apiv3-key"),
		cli.Flags("Scenario", "orders", "concurrency", "seed", "duplicate-rate", "concurrent-rate", "refund-rate", "full-refund-rate",
			"refund-first-rate", "cancel-rate", "forge-rate", "stale-rate", "lost-answer-rate"),
		cli.Flags("Provider retries", "tries", "retry-base"),
	},
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{Config: DefaultConfig(), secrets: map[string]*string{}}
	c := &o.Config
	fs := flag.NewFlagSet("paysim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.server, "server", "", "base `URL` of a running example server; empty: serve the example service in-process")
	fs.StringVar(&o.db, "db", "", "in-process: the service's "+dburl.Usage+" (default: sqlite:// in a temp dir); with -server: the server's database, read to count")
	fs.BoolVar(&o.naive, "naive", false, "also run the naive look-up-then-insert handler in-process and count its double applications")
	fs.StringVar(&o.naiveDB, "naive-db", "", "the naive handler's database, same forms as -db (default: sqlite:// in a temp dir)")
	fs.StringVar(&o.providers, "providers", strings.Join(providerNames, ","), "providers to play, comma-separated, round robin over the orders")
	o.secrets[idemstandard.Provider] = fs.String("webhook-secret", "", "Standard Webhooks signing secret (whsec_<base64>), the server's -webhook-secret; in-process: a fresh one")
	o.secrets[idemstripe.Provider] = fs.String("stripe-webhook-secret", "", "Stripe endpoint secret (whsec_…), the server's -stripe-webhook-secret; in-process: a fresh one")
	o.secrets[alipay.Provider] = fs.String("alipay-private-key", "", "PEM RSA private key `FILE` whose public half is the server's -alipay-public-key; in-process: a fresh one")
	alipayAppID := fs.String("alipay-app-id", defaultAlipayAppID, "`APPID` of Alipay's notifications (app_id): the server's -alipay-app-id")
	alipaySellerID := fs.String("alipay-seller-id", defaultAlipaySellerID, "`PID` of the seller of Alipay's notifications (seller_id): the server's -alipay-seller-id, where it sets one")
	o.secrets[wechatpay.Provider] = fs.String("wechatpay-private-key", "", "PEM RSA private key `FILE` whose public half is the server's -wechatpay-public-key; in-process: a fresh one")
	wechatSerial := fs.String("wechatpay-serial", defaultWechatpaySerial, "`SERIAL` of WeChat Pay's key sent in Wechatpay-Serial: the server's -wechatpay-serial")
	wechatAPIv3Key := fs.String("wechatpay-apiv3-key", "", "the merchant's APIv3 `KEY` (32 bytes) the resources are encrypted with: the server's -wechatpay-apiv3-key; in-process: a fresh one")
	fs.IntVar(&c.Orders, "orders", c.Orders, "orders to create and pay")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "orders played at once")
	fs.Float64Var(&c.DuplicateRate, "duplicate-rate", c.DuplicateRate, "probability that one of an order's events is delivered again later")
	fs.Float64Var(&c.ConcurrentRate, "concurrent-rate", c.ConcurrentRate, "probability that an order's success is delivered twice at once")
	fs.Float64Var(&c.RefundRate, "refund-rate", c.RefundRate, "probability that an order's payment is refunded")
	fs.Float64Var(&c.FullRefundRate, "full-refund-rate", c.FullRefundRate, "probability that a refund is of the whole amount (in two refunds; else a quarter)")
	fs.Float64Var(&c.RefundFirstRate, "refund-first-rate", c.RefundFirstRate, "probability that a refund is delivered before its payment's success")
	fs.Float64Var(&c.CancelRate, "cancel-rate", c.CancelRate, "probability that the user cancels as the success is delivered")
	fs.Float64Var(&c.ForgeRate, "forge-rate", c.ForgeRate, "probability of a forged callback (wrong secret, tampered body, unsigned) per order")
	fs.Float64Var(&c.StaleRate, "stale-rate", c.StaleRate, "probability of a correctly signed callback 10 minutes old per order (Alipay, which signs no time: one signed for another app)")
	fs.Float64Var(&c.LostAnswerRate, "lost-answer-rate", c.LostAnswerRate, "probability that a delivery's answer is lost on the way back (the provider retries)")
	fs.IntVar(&c.Tries, "tries", c.Tries, "deliveries of one event before the provider gives up, the first included")
	fs.DurationVar(&c.RetryBase, "retry-base", c.RetryBase, "first retry delay of the provider's schedule, doubled on each retry")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the orders, the scenarios and the injected faults")
	help.Install(fs)
	err := fs.Parse(args)
	if err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for name := range strings.SplitSeq(o.providers, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		secret, ok := o.secrets[name]
		if !ok {
			return o, fmt.Errorf("-providers: unknown provider %q; want %s", name, strings.Join(providerNames, ","))
		}
		if *secret == "" && o.server != "" {
			return o, fmt.Errorf("-server needs the %s secret matching the server's (-webhook-secret, -stripe-webhook-secret, -alipay-private-key, -wechatpay-private-key), or leave %s out of -providers", name, name)
		}
		var key any = *secret
		switch {
		case name == alipay.Provider:
			pk, err := rsaKeyOf("-alipay-private-key", *secret)
			if err != nil {
				return o, err
			}
			if *alipayAppID == "" {
				return o, errors.New("-alipay-app-id: empty; give the server's -alipay-app-id")
			}
			key = alipayKey{pk, *alipayAppID, *alipaySellerID}
		case name == wechatpay.Provider:
			pk, err := rsaKeyOf("-wechatpay-private-key", *secret)
			if err != nil {
				return o, err
			}
			apiV3Key := *wechatAPIv3Key
			switch {
			case apiV3Key == "" && o.server != "":
				return o, errors.New("-server needs -wechatpay-apiv3-key, the server's, or leave wechatpay out of -providers")
			case apiV3Key == "":
				var b [16]byte
				_, _ = rand.Read(b[:])
				apiV3Key = hex.EncodeToString(b[:])
			case len(apiV3Key) != 32:
				// Not the key itself: it is a secret.
				return o, fmt.Errorf("-wechatpay-apiv3-key: %d bytes; the APIv3 key has 32", len(apiV3Key))
			}
			if *wechatSerial == "" {
				return o, errors.New("-wechatpay-serial: empty; give the server's -wechatpay-serial")
			}
			key = wechatpayKey{pk, *wechatSerial, apiV3Key}
		case *secret != "":
		case name == idemstandard.Provider:
			key = NewStandardSecret()
		default:
			key = NewStripeSecret()
		}
		p, err := newProvider(name, key)
		if err != nil {
			return o, err
		}
		c.Providers = append(c.Providers, p)
	}
	return o, c.validate()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var tmp string
	tempURL := func(name string) (string, error) {
		if tmp == "" {
			if tmp, err = os.MkdirTemp("", "paysim-"); err != nil {
				return "", err
			}
		}
		return "sqlite://" + filepath.Join(tmp, name), nil
	}
	defer func() {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}()

	var targets []*target
	defer func() {
		for _, t := range targets {
			t.close()
		}
	}()
	if o.server != "" {
		t := &target{Name: "example server at " + o.server, URL: strings.TrimRight(o.server, "/")}
		if o.db != "" {
			db, _, dialect, err := dburl.Open(ctx, o.db)
			if err != nil {
				return err
			}
			defer db.Close()
			if t.Orders, err = ordersOf(dialect); err != nil {
				return err
			}
			t.DB = db
		}
		targets = append(targets, t)
	} else {
		url := o.db
		if url == "" {
			if url, err = tempURL("paysim.db"); err != nil {
				return err
			}
		}
		db, store, dialect, err := dburl.Open(ctx, url)
		if err != nil {
			return err
		}
		defer db.Close()
		t, err := startProtected(ctx, db, store, dialect, o.Providers)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	if o.naive {
		url := o.naiveDB
		if url == "" {
			if url, err = tempURL("paysim-naive.db"); err != nil {
				return err
			}
		}
		db, _, dialect, err := dburl.Open(ctx, url)
		if err != nil {
			return err
		}
		defer db.Close()
		t, err := startNaive(ctx, db, dialect, o.Providers)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}

	var results []*Result
	for _, t := range targets {
		fmt.Fprintf(stderr, "paysim: %d orders against %s (%s)\n", o.Orders, t.Name, t.URL)
		res, err := Run(ctx, o.Config, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
		results = append(results, res)
	}
	fmt.Fprint(stdout, Table(results))
	for _, r := range results {
		if r.Target != naiveName && (r.DoubleApplications != 0 || r.ForgeriesAccepted != 0 || r.Unexpected != 0) {
			return fmt.Errorf("%s: %d double applications, %d forgeries accepted, %d orders off their facts' state",
				r.Target, r.DoubleApplications, r.ForgeriesAccepted, r.Unexpected)
		}
	}
	return nil
}

// rsaKeyOf reads the provider's private key from file (flagName's), or
// makes a fresh one when file is "" (the in-process server is given its
// public half).
func rsaKeyOf(flagName, file string) (*rsa.PrivateKey, error) {
	if file == "" {
		return rsa.GenerateKey(rand.Reader, 2048)
	}
	key, err := readRSAKey(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	return key, nil
}
