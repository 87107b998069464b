package idempotency

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// recorder captures the wrapped handler's response so that it can be stored
// as a snapshot and committed before anything reaches the client. Like
// httptest.ResponseRecorder, the header map is snapshotted when the status is
// written; later header changes are ignored.
//
// It implements http.Flusher so that handlers which flush keep working, but a
// flush only marks the response as started: nothing can reach the client
// before the transaction commits. Unwrap exposes the real writer for
// http.ResponseController (deadlines, full duplex), but Hijack is refused
// here: a hijacked connection would answer before the commit, unrecorded.
type recorder struct {
	w          http.ResponseWriter
	header     http.Header
	sent       http.Header // header at WriteHeader time
	status     int
	body       bytes.Buffer
	limit      int  // max body bytes kept; 0 means no limit
	overflowed bool // the handler wrote more than limit bytes
}

func newRecorder(w http.ResponseWriter, limit int) *recorder {
	return &recorder{w: w, header: http.Header{}, limit: limit}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 || code < 100 || code > 999 {
		return
	}
	if code < 200 { // informational answers are not the response
		return
	}
	r.status = code
	r.sent = r.header.Clone()
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.limit > 0 && r.body.Len()+len(p) > r.limit {
		r.overflowed = true
		return len(p), nil // keep the handler going; the attempt fails at finalize
	}
	return r.body.Write(p)
}

// Flush implements http.Flusher. See the type's comment.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
}

// Hijack implements http.Hijacker so that http.ResponseController stops
// here instead of unwrapping to the client's connection: an idempotent
// handler's answer is the recorded one.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("idempotency: a protected handler cannot hijack the connection: %w", http.ErrNotSupported)
}

// Unwrap returns the client's ResponseWriter.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// result returns the status and headers the handler produced, defaulting to
// 200 for a handler that wrote nothing, each NUL in a header value turned
// into a space (withoutNUL).
func (r *recorder) result() (int, http.Header) {
	if r.status == 0 {
		return http.StatusOK, withoutNUL(r.header.Clone())
	}
	return r.status, withoutNUL(r.sent)
}

// withoutNUL replaces each NUL in h's values with a space, in place. RFC
// 9110 §5.5 calls a field value holding NUL invalid and dangerous and has a
// recipient reject it or replace each NUL with a space (net/http does so
// with CR and LF when it writes a header); PostgreSQL's jsonb cannot store
// one (22P05). Replacing it before the answer is sent and stored keeps the
// first answer and every replay equal on every dialect.
func withoutNUL(h http.Header) http.Header {
	for _, values := range h {
		for i, v := range values {
			if strings.IndexByte(v, 0) >= 0 {
				values[i] = strings.ReplaceAll(v, "\x00", " ")
			}
		}
	}
	return h
}
