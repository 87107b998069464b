package chaintest

import (
	"bytes"
	"net/http"
	"strconv"
)

// serverRecorder records an answer as net/http's server sends it, which
// httptest.ResponseRecorder does not quite: the status and the header are
// those of the first WriteHeader (or of the first byte, 200), a
// Content-Type is sniffed from the first bytes of the body when the header
// has none, even after an explicit WriteHeader, and no more body is sent
// than a declared Content-Length. Run serves chains in process through it
// as a server would.
type serverRecorder struct {
	header   http.Header
	status   int         // 0 until WriteHeader or the first byte
	sent     http.Header // the header as sent: nil until then
	sniffed  bool        // the first byte of the body went out
	body     bytes.Buffer
	declared int64 // the Content-Length sent; -1 for none
}

func newServerRecorder() *serverRecorder {
	return &serverRecorder{header: http.Header{}, declared: -1}
}

func (r *serverRecorder) Header() http.Header { return r.header }

func (r *serverRecorder) WriteHeader(code int) {
	if r.status != 0 || code < 200 { // informational answers are not the answer
		return
	}
	r.status, r.sent = code, r.header.Clone()
	if n, err := strconv.ParseInt(r.sent.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		r.declared = n
	}
}

func (r *serverRecorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if !r.sniffed && len(p) > 0 {
		r.sniffed = true
		if _, typed := r.sent["Content-Type"]; !typed && r.sent.Get("Transfer-Encoding") == "" {
			r.sent.Set("Content-Type", http.DetectContentType(p))
		}
	}
	if r.declared >= 0 && int64(r.body.Len()+len(p)) > r.declared {
		n, _ := r.body.Write(p[:r.declared-int64(r.body.Len())])
		return n, http.ErrContentLength
	}
	return r.body.Write(p)
}

// Flush sends the header, as the server's does.
func (r *serverRecorder) Flush() { r.WriteHeader(http.StatusOK) }

// result is the answer sent.
func (r *serverRecorder) result() (int, http.Header, []byte) {
	r.Flush()
	return r.status, r.sent, r.body.Bytes()
}
