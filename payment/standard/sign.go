package idemstandard

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Sign is for senders: it returns the headers of the message id with body,
// delivered at ts (webhook-id, webhook-timestamp and webhook-signature),
// signed with secret (whsec_<base64>) by the Standard Webhooks library,
// which a Verifier holding secret accepts within its tolerance of ts. The
// example simulator and other packages' tests send payment events with it;
// a real sender signs each delivery afresh, with the same id and a new ts.
func Sign(secret string, id string, ts time.Time, body []byte) (http.Header, error) {
	if id == "" {
		return nil, errors.New("idemstandard: Sign needs a message id; it is the event's idempotency key")
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("idemstandard: Sign: the secret is not base64 (whsec_<base64>): %w", err)
	}
	signature, err := wh.Sign(id, ts, body)
	if err != nil {
		return nil, fmt.Errorf("idemstandard: Sign: %w", err)
	}
	h := http.Header{}
	h.Set(IDHeader, id)
	h.Set(TimestampHeader, strconv.FormatInt(ts.Unix(), 10))
	h.Set(SignatureHeader, signature)
	return h, nil
}
