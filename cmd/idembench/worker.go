package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency/client"
)

type worker struct {
	id    int
	n     int
	buf   bytes.Buffer
	req   []byte              // the request being written (own connections)
	conns map[string]*ownConn // by URL, when the worker has its own (ownConns)
}

func (w *worker) user() int { return w.id%users + 1 }

// newKey is a fresh key per request, as a client creates one per intent: a
// UUIDv4, 36 characters, which is also what Fiber's idempotency middleware
// expects.
func (w *worker) newKey() string { return client.NewKey() }

func newWorker(id int) *worker { return &worker{id: id} }

// do sends one request and checks its answer. A wrong status, a missing
// replay marker or a replayed body that differs from the original is an
// error; the status is returned either way (0 for a transport error).
func (w *worker) do(client *http.Client, t target, rq request) (int, error) {
	if t.call != nil {
		status, replayed, err := t.call(w, rq)
		if err != nil {
			return status, err
		}
		return status, w.check(t, rq, status, replayed)
	}
	url := t.url
	if rq.url != "" {
		url = rq.url
	}
	var resp *http.Response
	var err error
	if w.conns != nil {
		resp, err = w.roundTrip(url, t.keyHeader, rq)
	} else {
		resp, err = w.clientRoundTrip(client, url, t.keyHeader, rq)
	}
	if err != nil {
		return 0, err
	}
	w.buf.Reset()
	_, err = io.Copy(&w.buf, resp.Body)
	resp.Body.Close()
	if w.conns != nil && (err != nil || resp.Close) {
		w.drop(url)
	}
	if err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, w.check(t, rq, resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true")
}

// check checks an answer whose body is in w.buf: its status, the replay
// mark a replay needs, and a replay's body against the original's.
func (w *worker) check(t target, rq request, status int, replayed bool) error {
	if status != t.wantStatus {
		return fmt.Errorf("status %d, want %d: %.200s", status, t.wantStatus, w.buf.Bytes())
	}
	if (t.wantReplayed || rq.kind == kindReplay) && !replayed {
		return fmt.Errorf("answer not marked a replay: %.200s", w.buf.Bytes())
	}
	if rq.want != nil && !bytes.Equal(w.buf.Bytes(), rq.want) {
		return fmt.Errorf("replayed body differs from the original:\n got %.200s\nwant %.200s", w.buf.Bytes(), rq.want)
	}
	return nil
}

func (w *worker) clientRoundTrip(client *http.Client, url, keyHeader string, rq request) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(rq.body))
	if err != nil {
		return nil, err
	}
	req.Header["Content-Type"] = hdrJSON
	req.Header["X-User-Id"] = userHeader[rq.user]
	if rq.key != "" {
		req.Header[keyHeader] = []string{rq.key}
	}
	return client.Do(req)
}

// ownConns gives the worker keep-alive connections of its own, one per
// server, on which it writes each request and reads its answer itself
// (roundTrip). net/http's Transport hands every request to a writer and a
// reader goroutine per connection and back: at tens of thousands of
// requests a second on two cores those handoffs were a fifth of the
// process's CPU and set the harness's own latency tail, which a cached
// replay is measured against. close releases them.
func (w *worker) ownConns() { w.conns = map[string]*ownConn{} }

// ownConn is one of a worker's HTTP/1.1 connections.
type ownConn struct {
	c    net.Conn
	r    *bufio.Reader
	path string
	host string
}

func (w *worker) close() {
	for _, c := range w.conns {
		c.c.Close()
	}
	clear(w.conns)
}

// roundTrip writes rq to url's server on the worker's connection to it
// (dialled on first use, and again after a failure) and reads the answer
// head; the caller reads and closes the body before the next request.
func (w *worker) roundTrip(url, keyHeader string, rq request) (*http.Response, error) {
	c, err := w.conn(url)
	if err != nil {
		return nil, err
	}
	b := w.req[:0]
	b = append(b, "POST "...)
	b = append(b, c.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nContent-Type: application/json\r\nX-User-Id: "...)
	b = append(b, userHeader[rq.user][0]...)
	if rq.key != "" {
		b = append(b, "\r\n"...)
		b = append(b, keyHeader...)
		b = append(b, ": "...)
		b = append(b, rq.key...)
	}
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(rq.body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, rq.body...)
	w.req = b
	_ = c.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.c.Write(b); err != nil {
		w.drop(url)
		return nil, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		w.drop(url)
		return nil, err
	}
	return resp, nil
}

func (w *worker) conn(url string) (*ownConn, error) {
	if c := w.conns[url]; c != nil {
		return c, nil
	}
	hostPort, path, ok := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	if !ok || strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("own connections take http://host/path URLs, got %q", url)
	}
	nc, err := net.DialTimeout("tcp", hostPort, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c := &ownConn{c: nc, r: bufio.NewReaderSize(nc, 16<<10), path: "/" + path, host: hostPort}
	w.conns[url] = c
	return c, nil
}

func (w *worker) drop(url string) {
	if c := w.conns[url]; c != nil {
		c.c.Close()
		delete(w.conns, url)
	}
}

func newClient(conc int) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        0, // no global limit
			MaxIdleConnsPerHost: max(conc, 64) + 16,
			IdleConnTimeout:     2 * time.Minute,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		},
	}
}
