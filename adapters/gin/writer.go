package idemgin

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
)

// noWritten is gin's size of a response whose header is not written yet.
const noWritten = -1

// responseWriter is the gin.ResponseWriter the protected handlers write
// through while the middleware records them. It keeps the rules of gin's own
// writer, so the recorder receives exactly what gin would have sent:
// WriteHeader only remembers the status, and the header goes to the recorder
// (which snapshots it) with the first byte, a Flush or WriteHeaderNow. c.JSON
// relies on this: it sets Content-Type after the status.
type responseWriter struct {
	http.ResponseWriter // the middleware's recorder
	status              int
	size                int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func newResponseWriter(w http.ResponseWriter) *responseWriter {
	return &responseWriter{ResponseWriter: w, status: http.StatusOK, size: noWritten}
}

// WriteHeader remembers the status until the header is written; after that
// it is ignored, as gin does.
func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

// WriteHeaderNow hands the recorder the status and the header as they are.
func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(data []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(data)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *responseWriter) Status() int   { return w.status }
func (w *responseWriter) Size() int     { return w.size }
func (w *responseWriter) Written() bool { return w.size != noWritten }

// Flush writes the header; nothing reaches the client before the commit.
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// errHijack refuses Hijack: a recorded answer is sent after the commit, so
// the connection cannot be the handler's.
var errHijack = errors.New("idemgin: a recorded response cannot be hijacked")

// Hijack implements http.Hijacker by refusing (see errHijack).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errHijack
}

// CloseNotify never fires: the handler's transaction deliberately outlives
// the client, so that a timed-out caller's order still commits and its retry
// replays it.
func (w *responseWriter) CloseNotify() <-chan bool { return make(chan bool) }

// Pusher is nil: nothing can be pushed before the answer is committed.
func (w *responseWriter) Pusher() http.Pusher { return nil }

// Unwrap returns the recorder, for http.ResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
