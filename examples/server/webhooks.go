package main

// The payment providers' callbacks: a route per provider whose secret the
// flags give, each a payment.Webhook on the service's order store, so that
// a callback is applied once per event id and answered in the provider's
// convention.

import (
	"crypto/rsa"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/alipay"
	idemstandard "github.com/orderguard/idempotency/payment/standard"
	idemstripe "github.com/orderguard/idempotency/payment/stripe"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

// webhookFlags are the payment providers' flags. A provider's route is
// mounted only when its secret is given.
type webhookFlags struct {
	stripeSecrets      string // comma-separated whsec_…
	standardSecrets    string // comma-separated whsec_…
	alipayPublicKey    string // PEM file
	alipayAppID        string // required with alipayPublicKey
	alipaySellerID     string // optional
	wechatpayPublicKey string // PEM file
	wechatpaySerial    string
	wechatpayAPIv3Key  string
	tolerance          time.Duration // of the providers that sign a timestamp
}

func (f *webhookFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.stripeSecrets, "stripe-webhook-secret", "", "Stripe endpoint signing `SECRETS` (whsec_…, comma-separated while one is rolled): serves POST /webhooks/stripe")
	fs.StringVar(&f.standardSecrets, "webhook-secret", "", "Standard Webhooks signing `SECRETS` (whsec_…, comma-separated while one is rolled): serves POST /webhooks/standard")
	fs.StringVar(&f.alipayPublicKey, "alipay-public-key", "", "`FILE` with Alipay's public key (PEM), with -alipay-app-id: serves POST /webhooks/alipay")
	fs.StringVar(&f.alipayAppID, "alipay-app-id", "", "the Alipay app's `APPID`, the only app_id whose notifications are taken (required with -alipay-public-key)")
	fs.StringVar(&f.alipaySellerID, "alipay-seller-id", "", "the merchant's Alipay `PID` (2088…): when set, the only seller_id whose notifications are taken")
	fs.StringVar(&f.wechatpayPublicKey, "wechatpay-public-key", "", "`FILE` with the WeChat Pay public key (PEM), with -wechatpay-serial and -wechatpay-apiv3-key: serves POST /webhooks/wechatpay")
	fs.StringVar(&f.wechatpaySerial, "wechatpay-serial", "", "`SERIAL` of the WeChat Pay public key (PUB_KEY_ID_…) or platform certificate")
	fs.StringVar(&f.wechatpayAPIv3Key, "wechatpay-apiv3-key", "", "the merchant's APIv3 `KEY` (32 bytes), which decrypts WeChat Pay's callbacks")
	fs.DurationVar(&f.tolerance, "webhook-tolerance", payment.DefaultTolerance, "how far a callback's signed timestamp may be from now (Stripe, Standard Webhooks, WeChat Pay; Alipay signs none)")
}

// webhookRoute is one provider's route and the verifier of its callbacks.
type webhookRoute struct {
	pattern  string // "POST /webhooks/stripe"
	verifier payment.Verifier
}

// routes returns the route of every provider configured, or an error that
// names the flag to fix. Nothing is read from the network.
func (f webhookFlags) routes() ([]webhookRoute, error) {
	var out []webhookRoute
	if f.tolerance <= 0 {
		return nil, fmt.Errorf("-webhook-tolerance %v: want a positive duration, such as 5m (the default)", f.tolerance)
	}
	if f.stripeSecrets != "" {
		secrets, err := whsecList("-stripe-webhook-secret", f.stripeSecrets)
		if err != nil {
			return nil, err
		}
		v, err := idemstripe.New(idemstripe.Config{Secrets: secrets, Tolerance: f.tolerance})
		if err != nil {
			return nil, fmt.Errorf("-stripe-webhook-secret: %w", err)
		}
		out = append(out, webhookRoute{"POST /webhooks/stripe", v})
	}
	if f.standardSecrets != "" {
		secrets, err := whsecList("-webhook-secret", f.standardSecrets)
		if err != nil {
			return nil, err
		}
		v, err := idemstandard.New(idemstandard.Config{Secrets: secrets, Tolerance: f.tolerance})
		if err != nil {
			return nil, fmt.Errorf("-webhook-secret: %w", err)
		}
		out = append(out, webhookRoute{"POST /webhooks/standard", v})
	}
	if f.alipayPublicKey == "" && (f.alipayAppID != "" || f.alipaySellerID != "") {
		return nil, errors.New("-alipay-public-key: -alipay-app-id and -alipay-seller-id configure the Alipay route, which needs Alipay's public key too")
	}
	if f.alipayPublicKey != "" {
		if f.alipayAppID == "" {
			// Alipay's key may be shared by the apps of one account: its
			// signature alone would let another app's notifications in.
			return nil, errors.New("-alipay-app-id: the Alipay route needs the APPID of the app whose notify_url it is, so that another app's notifications are refused")
		}
		key, err := readPublicKey("-alipay-public-key", f.alipayPublicKey, alipay.ParsePublicKey)
		if err != nil {
			return nil, err
		}
		v, err := alipay.New(alipay.Config{PublicKey: key, AppID: f.alipayAppID, SellerID: f.alipaySellerID})
		if err != nil {
			return nil, fmt.Errorf("-alipay-public-key: %w", err)
		}
		out = append(out, webhookRoute{"POST /webhooks/alipay", v})
	}
	wechat := map[string]string{
		"-wechatpay-public-key": f.wechatpayPublicKey,
		"-wechatpay-serial":     f.wechatpaySerial,
		"-wechatpay-apiv3-key":  f.wechatpayAPIv3Key,
	}
	var given, missing []string
	for _, name := range []string{"-wechatpay-public-key", "-wechatpay-serial", "-wechatpay-apiv3-key"} {
		if wechat[name] != "" {
			given = append(given, name)
		} else {
			missing = append(missing, name)
		}
	}
	if len(given) > 0 && len(missing) > 0 {
		return nil, fmt.Errorf("%s: WeChat Pay's callbacks need -wechatpay-public-key, -wechatpay-serial and -wechatpay-apiv3-key together; %s given",
			strings.Join(missing, ", "), strings.Join(given, ", "))
	}
	if len(given) > 0 {
		key, err := readPublicKey("-wechatpay-public-key", f.wechatpayPublicKey, wechatpay.ParsePublicKey)
		if err != nil {
			return nil, err
		}
		if len(f.wechatpayAPIv3Key) != 32 {
			// Not the key itself in the error: it is a secret.
			return nil, fmt.Errorf("-wechatpay-apiv3-key: %d bytes; the APIv3 key set in WeChat Pay's merchant platform has 32", len(f.wechatpayAPIv3Key))
		}
		v, err := wechatpay.New(wechatpay.Config{
			PlatformKeys: map[string]*rsa.PublicKey{f.wechatpaySerial: key},
			APIv3Key:     f.wechatpayAPIv3Key,
			Tolerance:    f.tolerance,
		})
		if err != nil {
			return nil, fmt.Errorf("-wechatpay-serial, -wechatpay-public-key: %w", err)
		}
		out = append(out, webhookRoute{"POST /webhooks/wechatpay", v})
	}
	return out, nil
}

// whsecList splits a comma-separated list of signing secrets, each of
// which must be written whsec_…: an API key or a bare base64 string
// pasted by mistake is refused at start, not at the first callback.
func whsecList(flagName, value string) ([]string, error) {
	var out []string
	for i, s := range strings.Split(value, ",") {
		s = strings.TrimSpace(s)
		if !strings.HasPrefix(s, "whsec_") || len(s) == len("whsec_") {
			// Never the value in the error: it is a secret.
			return nil, fmt.Errorf("%s: secret %d of %d does not start with whsec_; copy the endpoint's signing secret", flagName, i+1, strings.Count(value, ",")+1)
		}
		out = append(out, s)
	}
	return out, nil
}

// readPublicKey reads the PEM file of flagName with parse.
func readPublicKey(flagName, file string, parse func([]byte) (*rsa.PublicKey, error)) (*rsa.PublicKey, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	key, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", flagName, file, err)
	}
	return key, nil
}

// mountWebhooks serves each route on mux as svc's payment.Webhook, every
// callback's fate logged.
func mountWebhooks(mux *http.ServeMux, svc *orderservice.Service, hooks []webhookRoute, log *slog.Logger) error {
	for _, h := range hooks {
		wh, err := svc.PaymentWebhook(h.verifier, logObservation(log))
		if err != nil {
			return fmt.Errorf("%s: %w", h.pattern, err)
		}
		mux.Handle(h.pattern, wh)
	}
	return nil
}

// errWebhooksNeedIdempotency refuses the webhook flags with
// -idempotency=false: without the protocol a redelivered callback would
// apply its event again.
var errWebhooksNeedIdempotency = errors.New("the payment webhook flags (-stripe-webhook-secret, -webhook-secret, -alipay-public-key, -wechatpay-…) need the idempotency protocol, which applies each event once: drop -idempotency=false or the webhook flags")

// logObservation logs what became of each callback: a warning for a
// refused one, info otherwise.
func logObservation(log *slog.Logger) func(payment.Observation) {
	return func(o payment.Observation) {
		attrs := []any{"provider", o.Provider, "event", o.Event.ID, "type", o.Event.Type, "status", o.Status,
			"order", o.Outcome.OrderNo, "order_status", o.Outcome.Status, "replayed", o.Replayed}
		if o.Outcome.Anomaly != "" {
			attrs = append(attrs, "anomaly", o.Outcome.Anomaly)
		}
		if o.Refused != nil {
			log.Warn("payment callback refused", append(attrs, "err", o.Refused)...)
			return
		}
		log.Info("payment callback", attrs...)
	}
}
