package client

import (
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// seen is what the test server recorded for one attempt.
type seen struct {
	key         string
	sum         [32]byte
	length      int64
	keyVals     int
	contentType string
}

// server is an httptest server whose handler is told the 1-based attempt
// number, and which records every attempt's key and body hash.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	attempts []seen
}

func newServer(t *testing.T, handle func(attempt int, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.attempts = append(s.attempts, seen{
			key:         r.Header.Get(DefaultHeaderName),
			sum:         sha256.Sum256(body),
			length:      r.ContentLength,
			keyVals:     len(r.Header.Values(DefaultHeaderName)),
			contentType: r.Header.Get("Content-Type"),
		})
		n := len(s.attempts)
		s.mu.Unlock()
		handle(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.attempts...)
}

func (s *server) count() int { return len(s.seen()) }

// writeProblem answers like the server middleware does.
func writeProblem(w http.ResponseWriter, status int, kind string, retryAfter string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"type":"`+ProblemTypePrefix+kind+`","title":"t","status":`+strconv.Itoa(status)+`,"detail":"d"}`)
}

// writeCreated is the successful create-order answer.
func writeCreated(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"order_id":"o-1"}`)
}

// dropConnection makes the attempt fail in transport: the connection closes
// before any response.
func dropConnection(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	_ = conn.Close()
}

// sleeps records requested waits without waiting, and can advance a fake
// clock so that the budget can be tested without real time passing.
type sleeps struct {
	mu  sync.Mutex
	now time.Time
	got []time.Duration
}

func newSleeps() *sleeps {
	return &sleeps{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (s *sleeps) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, d)
	s.now = s.now.Add(d)
	return ctx.Err()
}

func (s *sleeps) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *sleeps) recorded() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.got...)
}

// fakePolicy waits for nothing and jitters to exactly half the ceiling.
func fakePolicy(s *sleeps) Policy {
	return Policy{Sleep: s.Sleep, Now: s.Now, Rand: func() float64 { return 0.5 }}
}

// sender sends one create-order request either through Client.Do or through
// an http.Client whose transport is a Transport, so every rule is checked on
// both entry points of the shared loop.
type sender struct {
	name string
	send func(t *testing.T, srv *server, p Policy, ctx context.Context, body, key string) (*http.Response, int, error)
}

var senders = []sender{
	{"Client.Do", func(t *testing.T, srv *server, p Policy, ctx context.Context, body, key string) (*http.Response, int, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		require.NoError(t, err)
		c := &Client{HTTP: srv.Client(), Policy: p}
		res, err := c.Do(ctx, req, key)
		if err != nil {
			return nil, -1, err
		}
		return res.Response, res.Attempts, nil
	}},
	{"Transport", func(t *testing.T, srv *server, p Policy, ctx context.Context, body, key string) (*http.Response, int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		require.NoError(t, err)
		if key != "" {
			req = WithKey(req, key)
		}
		hc := &http.Client{Transport: &Transport{Base: srv.Client().Transport, Policy: p}}
		resp, err := hc.Do(req)
		return resp, -1, err // the Transport cannot report attempts
	}},
}

func closeResp(t *testing.T, resp *http.Response) {
	t.Helper()
	if resp != nil {
		require.NoError(t, resp.Body.Close())
	}
}
