package client

import (
	"bytes"
	"context"
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

// run is the retry loop behind Transport and Client (Policy.Retry with
// HTTP's rules). It consumes and closes req.Body, never modifies req itself,
// and returns the final response or error together with the number of
// attempts sent.
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
	var resp *http.Response
	attempts, err := p.Retry(req.Context(), func(int) Outcome {
		discard(resp) // the previous attempt's, not returned
		var err error
		resp, err = send(attemptRequest(req, body))
		switch {
		case err != nil && (req.Context().Err() != nil || resp != nil):
			// The caller gave up, and the error already says so; or
			// http.Client's CheckRedirect refused: a local decision that
			// would repeat on every attempt.
			resp = nil
			return Outcome{Err: err}
		case err != nil:
			return Outcome{Retry: true, Err: err}
		case !retryable(resp):
			return Outcome{}
		}
		wait, _ := retryAfter(resp.Header, p.Now())
		return Outcome{Retry: true, Wait: wait, Err: errors.New("HTTP " + resp.Status), Answered: true}
	})
	if err != nil {
		discard(resp) // a retryable answer, if the caller's context ended after it
		return nil, attempts, err
	}
	return resp, attempts, nil
}

// Outcome is one attempt's outcome as Policy.Retry's attempt reports it.
type Outcome struct {
	// Retry says the outcome is one the contract calls retryable: a
	// transport error, an answer in progress, an infrastructure fault.
	Retry bool
	// Wait is how long the server asked to wait (Retry-After, gRPC's
	// RetryInfo), or 0: then the policy's backoff applies.
	Wait time.Duration
	// Err describes a failed attempt: the error Retry returns when it stops
	// on it, or wraps when it gives up after it.
	Err error
	// Answered says the attempt got an answer (a retryable one): when the
	// budget runs out after it, Retry returns nil and the caller returns
	// that answer instead of an error.
	Answered bool
}

// Retry runs attempt until its outcome is final, under the policy's budget,
// and returns the number of attempts made. It is the one retry loop of the
// contract, whatever the transport: Client and Transport run HTTP requests
// through it, the gRPC client interceptor (module
// github.com/orderguard/idempotency/grpc) unary calls. Between attempts it
// waits the outcome's Wait, or else the backoff; it stops when ctx ends, when
// MaxAttempts are made, or when the next wait would end after MaxElapsed.
// An error means no final outcome: attempt's own error for a final failed
// outcome, ErrGaveUp with the last error, or the context's error.
func (p Policy) Retry(ctx context.Context, attempt func(n int) Outcome) (attempts int, err error) {
	p = p.withDefaults()
	deadline := p.Now().Add(p.MaxElapsed)
	var lastErr error
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return n - 1, stopped(n-1, err, lastErr)
		}
		o := attempt(n)
		if !o.Retry {
			return n, o.Err
		}
		lastErr = o.Err
		wait := o.Wait
		if wait <= 0 {
			wait = p.backoff(n)
		}
		if (p.MaxAttempts > 0 && n >= p.MaxAttempts) || wait > deadline.Sub(p.Now()) {
			if o.Answered {
				return n, nil
			}
			return n, fmt.Errorf("%w after %d attempts: %w", ErrGaveUp, n, o.Err)
		}
		if err := p.Sleep(ctx, wait); err != nil {
			return n, stopped(n, err, lastErr)
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

// retryable reports whether resp is a transient answer (Retryable).
func retryable(resp *http.Response) bool {
	kind := ""
	if resp.StatusCode == http.StatusConflict { // only then does the kind matter
		kind = readProblem(resp).Kind()
	}
	return Retryable(resp.StatusCode, kind)
}

// Retryable reports whether an answer with this HTTP status and problem
// kind is transient: the same request with the same key may turn it into a
// final one. That is 429, 502, 503 and 504, and a 409 only for in-progress:
// any other conflict, key-reused above all, is final. Transports other than
// HTTP map their codes onto it (the gRPC client interceptor maps
// UNAVAILABLE to 503, ABORTED in progress to 409 in-progress), so every
// client of the contract retries the same answers.
func Retryable(status int, problemKind string) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return problemKind == ProblemInProgress
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
