package idemstandard

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/orderguard/idempotency/payment"
)

// Provider is the name of Standard Webhooks senders in
// payment.Event.Provider.
const Provider = "standard"

// The headers of a signed message, as the specification names them.
const (
	// IDHeader carries the message id: payment.Event.ID.
	IDHeader = standardwebhooks.HeaderWebhookID
	// TimestampHeader carries the delivery's Unix time in seconds.
	TimestampHeader = standardwebhooks.HeaderWebhookTimestamp
	// SignatureHeader carries the space-separated "v1,<base64>"
	// signatures.
	SignatureHeader = standardwebhooks.HeaderWebhookSignature
)

// Config configures a Verifier.
type Config struct {
	// Secrets are the endpoint's signing secrets, base64, usually written
	// "whsec_<base64>" (the prefix is optional). A message verifies when
	// any of them verifies it: while a secret is rolled, list the new one
	// and the old one. Required, at least one.
	Secrets []string
	// Tolerance is how far webhook-timestamp may be from Verify's now,
	// either way; further is payment.ErrStale. Defaults to
	// payment.DefaultTolerance (the specification's 5 minutes).
	Tolerance time.Duration
	// MaxBodyBytes is the largest body accepted; a larger one is
	// payment.ErrTooLarge. Defaults to payment.MaxBodyBytes.
	MaxBodyBytes int
}

// Verifier verifies Standard Webhooks messages of the payment event
// schema (see the package doc). It is a payment.Verifier, safe for
// concurrent use.
type Verifier struct {
	webhooks     []*standardwebhooks.Webhook
	tolerance    time.Duration
	maxBodyBytes int
}

var _ payment.Verifier = (*Verifier)(nil)

// New returns a Verifier, or an error saying what in cfg to fix.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.Secrets) == 0 {
		return nil, errors.New("idemstandard: Config.Secrets is empty; set the endpoint's signing secret (whsec_<base64>) from the sender")
	}
	webhooks := make([]*standardwebhooks.Webhook, len(cfg.Secrets))
	for i, s := range cfg.Secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			// The library's error does not carry the secret.
			return nil, fmt.Errorf("idemstandard: Config.Secrets[%d] is not a base64 secret (whsec_<base64>): %w", i, err)
		}
		webhooks[i] = wh
	}
	if cfg.Tolerance < 0 {
		return nil, fmt.Errorf("idemstandard: Config.Tolerance is %v; leave it 0 for the default", cfg.Tolerance)
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = payment.DefaultTolerance
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("idemstandard: Config.MaxBodyBytes is %d; leave it 0 for the default", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = payment.MaxBodyBytes
	}
	return &Verifier{webhooks: webhooks, tolerance: cfg.Tolerance, maxBodyBytes: cfg.MaxBodyBytes}, nil
}

// Provider returns "standard".
func (v *Verifier) Provider() string { return Provider }

// Verify checks the message's signature with the Standard Webhooks
// library, then webhook-timestamp against now, and only then reads the
// body as the package doc's schema.
func (v *Verifier) Verify(header http.Header, body []byte, now time.Time) (payment.Event, error) {
	if len(body) > v.maxBodyBytes {
		return payment.Event{}, fmt.Errorf("idemstandard: body of %d bytes is over %d: %w", len(body), v.maxBodyBytes, payment.ErrTooLarge)
	}
	signed := http.Header{}
	for _, name := range [...]string{IDHeader, TimestampHeader, SignatureHeader} {
		value := payment.HeaderValue(header, name)
		if value == "" {
			return payment.Event{}, fmt.Errorf("idemstandard: no %s header: %w: %w", name, payment.ErrSignature, standardwebhooks.ErrRequiredHeaders)
		}
		signed.Set(name, value)
	}
	if err := v.verifySignature(body, signed); err != nil {
		return payment.Event{}, err
	}
	// The library parsed the same value before it verified.
	unix, err := strconv.ParseInt(signed.Get(TimestampHeader), 10, 64)
	if err != nil {
		return payment.Event{}, fmt.Errorf("idemstandard: %s: %w: %w", TimestampHeader, payment.ErrSignature, standardwebhooks.ErrInvalidHeaders)
	}
	if err := v.checkTimestamp(time.Unix(unix, 0), now); err != nil {
		return payment.Event{}, err
	}
	digest := sha256.Sum256(body)
	return readEvent(signed.Get(IDHeader), body, hex.EncodeToString(digest[:]))
}

// verifySignature verifies the message with each secret in turn. The
// library's Verify would check the timestamp against the wall clock, so
// the timestamp is left to checkTimestamp.
func (v *Verifier) verifySignature(body []byte, signed http.Header) error {
	var firstErr error
	for _, wh := range v.webhooks {
		err := wh.VerifyIgnoringTimestamp(body, signed)
		if err == nil {
			return nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return fmt.Errorf("idemstandard: %w: %w", payment.ErrSignature, firstErr)
}

// checkTimestamp refuses a signed time more than the tolerance from now.
func (v *Verifier) checkTimestamp(signedAt, now time.Time) error {
	d := now.Sub(signedAt)
	var libErr error
	switch {
	case d > v.tolerance:
		libErr = standardwebhooks.ErrMessageTooOld
	case d < -v.tolerance:
		libErr = standardwebhooks.ErrMessageTooNew
	default:
		return nil
	}
	return fmt.Errorf("idemstandard: signed at %s, %v from now, over the tolerance of %v: %w: %w",
		signedAt.UTC().Format(time.RFC3339), d, v.tolerance, payment.ErrStale, libErr)
}

// Acknowledge answers 204 No Content: senders stop delivering a message on
// any 2xx.
func (v *Verifier) Acknowledge(w http.ResponseWriter) {
	w.WriteHeader(http.StatusNoContent)
}

// Refuse answers status with message as plain text; the sender delivers
// the message again on its retry schedule. A status outside 4xx and 5xx is
// written as 500, since a refusal is never a success.
func (v *Verifier) Refuse(w http.ResponseWriter, status int, message string) {
	payment.RefusePlain(w, status, message)
}
