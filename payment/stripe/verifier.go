package idemstripe

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/orderguard/idempotency/payment"
)

// Provider is the name of Stripe in payment.Event.Provider.
const Provider = "stripe"

// SignatureHeader is the header Stripe signs its webhook events in.
const SignatureHeader = "Stripe-Signature"

// secretPrefix starts every Stripe endpoint secret, the dashboard's and the
// Stripe CLI's.
const secretPrefix = "whsec_"

// Config configures a Verifier.
type Config struct {
	// Secrets are the endpoint's signing secrets (whsec_…). An event
	// verifies when any of them verifies it: while a secret is rolled,
	// list the new one and the old one until the old one expires.
	// Required, at least one.
	Secrets []string
	// Tolerance is how far the signed timestamp may be from Verify's now,
	// either way; further is payment.ErrStale. Defaults to
	// payment.DefaultTolerance (Stripe's own default, 5 minutes).
	Tolerance time.Duration
	// MaxBodyBytes is the largest body accepted; a larger one is
	// payment.ErrTooLarge. Defaults to payment.MaxBodyBytes.
	MaxBodyBytes int
}

// Verifier verifies Stripe's webhook events. It is a payment.Verifier, safe
// for concurrent use.
type Verifier struct {
	secrets      []string
	tolerance    time.Duration
	maxBodyBytes int
}

var _ payment.Verifier = (*Verifier)(nil)

// New returns a Verifier, or an error saying what in cfg to fix.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.Secrets) == 0 {
		return nil, errors.New("idemstripe: Config.Secrets is empty; set the endpoint's signing secret (whsec_…) from Stripe's dashboard or the Stripe CLI")
	}
	for i, s := range cfg.Secrets {
		if !strings.HasPrefix(s, secretPrefix) || len(s) == len(secretPrefix) {
			return nil, fmt.Errorf("idemstripe: Config.Secrets[%d] is not an endpoint signing secret; copy the whsec_… secret of the webhook endpoint (not an API key)", i)
		}
	}
	if cfg.Tolerance < 0 {
		return nil, fmt.Errorf("idemstripe: Config.Tolerance is %v; leave it 0 for the default", cfg.Tolerance)
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = payment.DefaultTolerance
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("idemstripe: Config.MaxBodyBytes is %d; leave it 0 for the default", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = payment.MaxBodyBytes
	}
	return &Verifier{
		secrets:      append([]string(nil), cfg.Secrets...),
		tolerance:    cfg.Tolerance,
		maxBodyBytes: cfg.MaxBodyBytes,
	}, nil
}

// Provider returns "stripe".
func (v *Verifier) Provider() string { return Provider }

// Verify checks the Stripe-Signature header over body with stripe-go, then
// the signed timestamp against now, and only then reads the event, as the
// package doc describes.
func (v *Verifier) Verify(header http.Header, body []byte, now time.Time) (payment.Event, error) {
	if len(body) > v.maxBodyBytes {
		return payment.Event{}, fmt.Errorf("idemstripe: body of %d bytes is over %d: %w", len(body), v.maxBodyBytes, payment.ErrTooLarge)
	}
	sigHeader := payment.HeaderValue(header, SignatureHeader)
	ev, err := v.construct(body, sigHeader)
	if err != nil {
		return payment.Event{}, err
	}
	signedAt, ok := signedTimestamp(sigHeader)
	if !ok {
		return payment.Event{}, fmt.Errorf("idemstripe: %s has no timestamp t: %w", SignatureHeader, payment.ErrSignature)
	}
	if d := now.Sub(signedAt); d > v.tolerance || d < -v.tolerance {
		return payment.Event{}, fmt.Errorf("idemstripe: signed at %s, %v from now, over the tolerance of %v: %w: %w",
			signedAt.UTC().Format(time.RFC3339), d, v.tolerance, payment.ErrStale, webhook.ErrTooOld)
	}
	digest := sha256.Sum256(body)
	return readEvent(ev, hex.EncodeToString(digest[:]))
}

// construct verifies body with each secret in turn and returns the event
// of the first that verifies it. The tolerance is left to Verify, since
// stripe-go reads the wall clock.
func (v *Verifier) construct(body []byte, sigHeader string) (stripe.Event, error) {
	opts := webhook.ConstructEventOptions{IgnoreTolerance: true, IgnoreAPIVersionMismatch: true}
	var firstErr error
	for _, secret := range v.secrets {
		ev, err := webhook.ConstructEventWithOptions(body, sigHeader, secret, opts)
		switch {
		case err == nil:
			return ev, nil
		case isSignatureError(err):
			if firstErr == nil {
				firstErr = err
			}
		default:
			// stripe-go unmarshals only after the signature verified.
			return stripe.Event{}, fmt.Errorf("idemstripe: %v: %w", err, payment.ErrMalformed)
		}
	}
	return stripe.Event{}, fmt.Errorf("idemstripe: %w: %w", payment.ErrSignature, firstErr)
}

func isSignatureError(err error) bool {
	return errors.Is(err, webhook.ErrNotSigned) ||
		errors.Is(err, webhook.ErrInvalidHeader) ||
		errors.Is(err, webhook.ErrNoValidSignature) ||
		errors.Is(err, webhook.ErrTooOld)
}

// signedTimestamp reads t of a Stripe-Signature header that stripe-go has
// verified, as stripe-go reads it: comma-separated name=value pairs, the
// last t winning, so that the time checked is the time signed.
func signedTimestamp(sigHeader string) (time.Time, bool) {
	var (
		at    time.Time
		found bool
	)
	for pair := range strings.SplitSeq(sigHeader, ",") {
		name, value, ok := strings.Cut(pair, "=")
		if !ok || name != "t" {
			continue
		}
		unix, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		at, found = time.Unix(unix, 0), true
	}
	return at, found
}

// Acknowledge answers 200 with the JSON body {"received":true}: Stripe
// stops delivering an event on any 2xx.
func (v *Verifier) Acknowledge(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"received":true}` + "\n"))
}

// Refuse answers status with message as plain text; Stripe shows it in the
// dashboard's delivery attempts and delivers the event again, with
// exponential backoff for up to three days. A status outside 4xx and 5xx
// is written as 500, since a refusal is never a success.
func (v *Verifier) Refuse(w http.ResponseWriter, status int, message string) {
	payment.RefusePlain(w, status, message)
}
