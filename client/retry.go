package client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ErrGaveUp is wrapped, together with the last attempt's error, when the
// retry budget ran out and the last attempt ended in a transport error. It is
// not used when the last attempt got a response: that response is returned.
var ErrGaveUp = errors.New("idempotency client: gave up retrying")

// maxDrainBytes bounds how much of a discarded body is read so that its
// connection can be reused; beyond it, closing the connection is cheaper.
const maxDrainBytes = 64 << 10

// sendFunc performs one attempt: http.RoundTripper.RoundTrip for Transport,
// http.Client.Do for Client.
type sendFunc func(*http.Request) (*http.Response, error)

// run is the single retry loop behind Transport and Client. It consumes and
// closes req.Body, never modifies req itself, and returns the final response
// or error together with the number of attempts sent.
func (p Policy) run(req *http.Request, send sendFunc) (*http.Response, int, error) {
	p = p.withDefaults()
	if err := checkKeyHeader(req.Header, p.HeaderName); err != nil {
		closeBody(req)
		return nil, 0, err
	}
	body, err := bufferBody(req)
	if err != nil {
		return nil, 0, err
	}

	ctx := req.Context()
	deadline := p.Now().Add(p.MaxElapsed)
	var lastErr error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, attempt - 1, stopped(attempt-1, err, lastErr)
		}
		resp, err := send(attemptRequest(req, body))

		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				// The caller gave up; the error already says so.
				return nil, attempt, err
			}
			if resp != nil {
				// Only http.Client does this, when its CheckRedirect refuses:
				// a local decision that would repeat on every attempt.
				return nil, attempt, err
			}
			lastErr = err
			wait = p.backoff(attempt)
		} else {
			if !retryable(resp) {
				return resp, attempt, nil
			}
			lastErr = errors.New("HTTP " + resp.Status)
			var ok bool
			if wait, ok = retryAfter(resp.Header, p.Now()); !ok {
				wait = p.backoff(attempt)
			}
		}

		if (p.MaxAttempts > 0 && attempt >= p.MaxAttempts) || wait > deadline.Sub(p.Now()) {
			if resp != nil {
				return resp, attempt, nil
			}
			return nil, attempt, fmt.Errorf("%w after %d attempts: %w", ErrGaveUp, attempt, err)
		}
		discard(resp)
		if err := p.Sleep(ctx, wait); err != nil {
			return nil, attempt, stopped(attempt, err, lastErr)
		}
	}
}

// stopped describes an interruption by the caller's context. Only the context
// error is wrapped, so errors.Is cannot confuse, say, an earlier per-attempt
// timeout with the caller's own cancellation; the last outcome is text.
func stopped(attempts int, err, last error) error {
	if last == nil {
		return fmt.Errorf("idempotency client: stopped after %d attempts: %w", attempts, err)
	}
	return fmt.Errorf("idempotency client: stopped after %d attempts (last: %v): %w", attempts, last, err)
}

// retryable reports whether resp is a transient answer that the same request
// with the same key may turn into a final one. A 409 is retried only for
// in-progress: any other conflict, key-reused above all, is final.
func retryable(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return readProblem(resp).Kind() == ProblemInProgress
	default:
		return false
	}
}

// checkKeyHeader requires exactly one valid key in h. Several values would be
// ambiguous, so they are rejected like a malformed key.
func checkKeyHeader(h http.Header, name string) error {
	vals := h.Values(name)
	switch len(vals) {
	case 0:
		return ErrNoKey
	case 1:
		return checkKey(vals[0])
	default:
		return ErrInvalidKey
	}
}

// bufferBody reads the request body once so that every attempt can send the
// same bytes. GetBody is preferred because it yields the body from the start
// even if someone already read from req.Body. req.Body is always closed, as
// the RoundTripper contract demands.
func bufferBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer closeBody(req)
	src := req.Body
	if req.GetBody != nil {
		b, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("idempotency client: get request body: %w", err)
		}
		defer b.Close()
		src = b
	}
	buf, err := io.ReadAll(src)
	if err != nil {
		return nil, fmt.Errorf("idempotency client: read request body: %w", err)
	}
	return buf, nil
}

// attemptRequest clones req for one attempt with a fresh reader over body,
// since a sent body cannot be rewound and the request must not be mutated.
func attemptRequest(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.ContentLength = int64(len(body))
	if body == nil { // the request had no body at all
		r.Body, r.GetBody = req.Body, nil
		return r
	}
	r.GetBody = func() (io.ReadCloser, error) {
		if len(body) == 0 {
			return http.NoBody, nil
		}
		return io.NopCloser(bytes.NewReader(body)), nil
	}
	r.Body, _ = r.GetBody()
	return r
}

// discard drains a little of a response that will not be returned and closes
// it, so the connection can be reused.
func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrainBytes)
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
