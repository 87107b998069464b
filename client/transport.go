package client

import (
	"net/http"
	"strings"
)

// ReplayedHeader is the response header the server sets to "true" when it
// replays the stored answer of a finished key.
const ReplayedHeader = "Idempotent-Replayed"

// Transport is an http.RoundTripper that retries requests carrying an
// idempotency key under Policy. It never adds or changes a key: set one with
// WithKey or the header before sending. An http.Client.Timeout around a
// Transport bounds all attempts together, not each one. Do not put a
// Transport under Client.HTTP, or every attempt would be retried twice over.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper
	// Policy configures the retries.
	Policy Policy
}

// RoundTrip sends req, retrying transient failures with the same key and the
// same body bytes. It returns ErrNoKey or ErrInvalidKey without sending
// anything when the Policy.HeaderName header is missing or malformed. When the
// budget runs out it returns the last response unchanged, or, if the last
// attempt failed in transport, an error wrapping ErrGaveUp and that failure.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, _, err := t.Policy.run(req, base.RoundTrip)
	return resp, err
}

// WithKey returns a copy of req whose DefaultHeaderName header is key; req
// itself is not modified and the copy shares its body. With a custom
// Policy.HeaderName, set that header instead.
func WithKey(req *http.Request, key string) *http.Request {
	r := req.Clone(req.Context())
	r.Header.Set(DefaultHeaderName, key)
	return r
}

// Replayed reports whether resp is the server's replay of an earlier answer
// for the same key, that is, whether the action had already been executed.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(ReplayedHeader)), "true")
}
