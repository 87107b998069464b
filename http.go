package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// exchange is one HTTP request through Handler: the net/http front-end of
// the protocol. It reads the action from the request (steps 1 to 3), runs
// the handler through a recorder whenever the protocol executes, and writes
// the protocol's answer once.
type exchange struct {
	a          *attempt
	w          http.ResponseWriter
	r          *http.Request
	next       http.Handler
	body       []byte
	bodyReader bodyReader // r.Body from step 3 on (rewindBody)
}

// serve reads the action and hands it to the protocol.
func (x *exchange) serve() {
	a := x.a
	// 1. Key.
	if err := x.readKey(); err != nil {
		if errors.Is(err, ErrMissingKey) && a.m.cfg.KeyOptional {
			x.passThrough()
			return
		}
		a.reject(err)
		x.send(a.answer)
		return
	}
	// 2. Scope.
	if err := x.readScope(); err != nil {
		a.reject(err)
		x.send(a.answer)
		return
	}
	// 3. Fingerprint.
	if err := x.readFingerprint(); err != nil {
		a.reject(err)
		x.send(a.answer)
		return
	}
	// 4 to 7: the protocol (idempotency.go).
	x.send(a.protect(x.run))
}

// passThrough serves a keyless request unprotected (KeyOptional).
func (x *exchange) passThrough() {
	defer func() {
		if v := recover(); v != nil {
			x.a.done(Event{Outcome: OutcomeUnprotected, Err: fmt.Errorf("idempotency: handler panicked: %v", v)})
			panic(v)
		}
	}()
	x.next.ServeHTTP(x.w, x.r)
	x.a.done(Event{Outcome: OutcomeUnprotected})
}

// readKey is step 1: the key header, in plain or RFC 8941 sf-string form.
func (x *exchange) readKey() error {
	name := x.a.m.cfg.HeaderName
	values := x.r.Header.Values(name)
	switch {
	case len(values) == 0 || (len(values) == 1 && strings.Trim(values[0], " \t") == ""):
		// An empty header is no key, as it is on every front-end (HTTP/1
		// trims the blanks around a value; HTTP/2 does not).
		return ErrMissingKey
	case len(values) > 1:
		return fmt.Errorf("%w: send exactly one %s header", ErrInvalidKey, name)
	}
	key, err := ParseKey(values[0], x.a.m.cfg.MaxKeyLength)
	if err != nil {
		return err
	}
	x.a.key = key
	return nil
}

// readScope is step 2: the principal that owns the key.
func (x *exchange) readScope() error {
	scope, err := x.a.m.cfg.ScopeFunc(x.r)
	if err != nil {
		var p *Problem
		if errors.As(err, &p) {
			return p
		}
		return NewProblem(http.StatusUnauthorized, ProblemScopeRequired, "Unauthenticated", err.Error())
	}
	if err := x.a.m.scopeFits(scope); err != nil {
		return NewProblem(http.StatusUnauthorized, ProblemScopeRequired, "Unauthenticated", err.Error())
	}
	x.a.scope = scope
	x.a.keyHash = KeyHash(scope, x.a.key)
	return nil
}

// readFingerprint is step 3. The body is read through MaxBodyBytes, so an
// oversized body is refused without being held in memory, and r.Body is
// replaced with the bytes read so the handler sees the same body.
func (x *exchange) readFingerprint() error {
	limit := x.a.m.cfg.MaxBodyBytes
	if x.r.ContentLength > limit {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, x.r.ContentLength, limit)
	}
	if x.r.Body != nil && x.r.Body != http.NoBody {
		body, err := readBody(x.r.Body, x.r.ContentLength, limit)
		if err != nil {
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				return fmt.Errorf("%w: %v", ErrBodyTooLarge, err)
			}
			return fmt.Errorf("%w: %v", ErrInvalidBody, err)
		}
		if int64(len(body)) > limit {
			return fmt.Errorf("%w: limit %d bytes", ErrBodyTooLarge, limit)
		}
		x.body = body
	}
	x.rewindBody()
	x.r.ContentLength = int64(len(x.body))

	fp, err := x.a.m.fingerprint(x.r, x.body)
	if err != nil {
		return err
	}
	if err := x.a.m.fingerprintFits(fp); err != nil {
		return err
	}
	x.a.fingerprint = fp
	return nil
}

// readBody reads at most limit+1 bytes of body. A declared length sizes the
// buffer, so a body is read into one allocation of its own size.
func readBody(body io.Reader, declared, limit int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 && declared <= limit {
		size = declared + 1 // +1: room to see the end without growing
	}
	buf := make([]byte, 0, size)
	r := io.LimitedReader{R: body, N: limit + 1}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// rewindBody gives the request the body that was read, from its start, for
// the fingerprint and for each run of the handler.
func (x *exchange) rewindBody() {
	x.bodyReader.Reset(x.body)
	x.r.Body = &x.bodyReader
}

// bodyReader is the body the handler reads: the bytes read in step 3.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// run is the protocol's RunFunc for an HTTP request: the handler, on the
// whole body again, writing into a recorder, so that nothing reaches the
// client before the protocol has committed (or recorded) the answer. A
// handler that panics with http.ErrAbortHandler asks net/http to abort the
// response: the protocol rolls back and releases, and send panics again.
func (x *exchange) run(ctx context.Context) (res Result) {
	x.rewindBody()
	rec := newRecorder(x.w, x.a.m.cfg.MaxSnapshotBytes)
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v) // the protocol recovers it: rolled back, released, 500
			}
			res = Result{Abort: http.ErrAbortHandler}
		}
	}()
	x.next.ServeHTTP(rec, x.r.WithContext(ctx))
	status, header := rec.result()
	return Result{Status: status, Header: header, Body: rec.body.Bytes(), TooLarge: rec.overflowed}
}

// send writes the protocol's answer: a problem, a replay marked
// Idempotent-Replayed, or the handler's own answer.
func (x *exchange) send(ans Answer) {
	switch {
	case ans.Abort != nil:
		panic(ans.Abort) // net/http aborts the response, as the handler asked
	case ans.Problem != nil:
		WriteProblem(x.w, ans.Problem)
	case ans.Replayed:
		x.w.Header().Set("Idempotent-Replayed", "true")
		writeResponse(x.w, ans.Status, ans.Header, ans.Body)
	default:
		writeResponse(x.w, ans.Status, ans.Header, ans.Body)
	}
}

func writeResponse(w http.ResponseWriter, status int, header http.Header, body []byte) {
	dst := w.Header()
	for k, v := range header {
		dst[k] = slices.Clone(v) // a snapshot may be cached: never share its slices
	}
	dst.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
