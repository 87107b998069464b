package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Client sends requests under an idempotency key with retries. The zero value
// is usable and sends through http.DefaultClient.
type Client struct {
	// HTTP sends each attempt; its Timeout, if any, bounds a single attempt,
	// and a timed-out attempt is retried. Nil means http.DefaultClient. Its
	// Transport must not be a *Transport, or attempts would nest.
	HTTP *http.Client
	// Policy configures the retries.
	Policy Policy
}

// Result is the final answer of Client.Do.
type Result struct {
	// Response is the final response; the caller must close its body.
	Response *http.Response
	// Replayed is true when the server replayed an earlier answer for the
	// key instead of executing the action now.
	Replayed bool
	// Attempts is the number of requests sent, retries included.
	Attempts int
	// Problem is the parsed application/problem+json body, or nil. The
	// body stays fully readable from Response.
	Problem *Problem
}

// Do sends req with the idempotency key set to key (replacing any key
// header), retrying under c.Policy. ctx replaces req's context; req itself is
// not modified but its body is consumed and closed. Do returns ErrNoKey for an
// empty key and ErrInvalidKey for one the server would reject, without sending
// anything. A non-2xx final answer is a Result, not an error; errors mean no
// final answer was obtained (see Transport.RoundTrip for give-up rules).
func (c *Client) Do(ctx context.Context, req *http.Request, key string) (*Result, error) {
	if req == nil {
		return nil, errors.New("idempotency client: nil request")
	}
	if err := checkKey(key); err != nil {
		closeBody(req)
		return nil, err
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	r := req.Clone(ctx)
	name := c.Policy.HeaderName
	if name == "" {
		name = DefaultHeaderName
	}
	r.Header.Set(name, key)

	resp, attempts, err := c.Policy.run(r, hc.Do)
	if err != nil {
		return nil, err
	}
	return &Result{
		Response: resp,
		Replayed: Replayed(resp),
		Attempts: attempts,
		Problem:  readProblem(resp),
	}, nil
}

// PostJSON POSTs body encoded as JSON to url under key; see Do. The body is
// encoded once, so every attempt sends the same bytes.
func (c *Client) PostJSON(ctx context.Context, url, key string, body any) (*Result, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("idempotency client: encode body: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("idempotency client: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, application/problem+json")
	return c.Do(ctx, req, key)
}
