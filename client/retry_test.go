package client

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOnlyTransientFailuresAreRetried(t *testing.T) {
	t.Parallel()
	status := func(code int) func(*testing.T, http.ResponseWriter) {
		return func(_ *testing.T, w http.ResponseWriter) { w.WriteHeader(code) }
	}
	problem := func(code int, kind string) func(*testing.T, http.ResponseWriter) {
		return func(_ *testing.T, w http.ResponseWriter) { writeProblem(w, code, kind, "") }
	}
	rows := []struct {
		name  string
		first func(t *testing.T, w http.ResponseWriter)
		retry bool
		final int // status of the answer the caller gets when not retried
	}{
		{"transport error is retried", func(t *testing.T, w http.ResponseWriter) { dropConnection(t, w) }, true, 0},
		{"409 in-progress is retried", func(_ *testing.T, w http.ResponseWriter) {
			writeProblem(w, http.StatusConflict, ProblemInProgress, "1")
		}, true, 0},
		{"429 is retried", status(http.StatusTooManyRequests), true, 0},
		{"502 is retried", status(http.StatusBadGateway), true, 0},
		{"503 store-unavailable is retried", problem(http.StatusServiceUnavailable, ProblemStoreUnavailable), true, 0},
		{"503 commit-outcome-unknown is retried", problem(http.StatusServiceUnavailable, ProblemCommitUnknown), true, 0},
		{"503 rerun-refused is retried", problem(http.StatusServiceUnavailable, ProblemRerunRefused), true, 0},
		{"504 is retried", status(http.StatusGatewayTimeout), true, 0},

		{"409 key-reused is final", problem(http.StatusConflict, ProblemKeyReused), false, http.StatusConflict},
		{"409 that is not a problem is final", func(_ *testing.T, w http.ResponseWriter) {
			http.Error(w, "in-progress", http.StatusConflict)
		}, false, http.StatusConflict},
		{"409 with a foreign problem type is final", func(_ *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"in-progress","status":409}`)
		}, false, http.StatusConflict},
		{"422 key-reused is final", problem(http.StatusUnprocessableEntity, ProblemKeyReused), false, http.StatusUnprocessableEntity},
		{"400 invalid-body is final", problem(http.StatusBadRequest, ProblemInvalidBody), false, http.StatusBadRequest},
		{"401 scope-required is final", problem(http.StatusUnauthorized, ProblemScopeRequired), false, http.StatusUnauthorized},
		{"400 out-of-bounds is final", problem(http.StatusBadRequest, ProblemOutOfBounds), false, http.StatusBadRequest},
		{"403 is final", status(http.StatusForbidden), false, http.StatusForbidden},
		{"404 is final", status(http.StatusNotFound), false, http.StatusNotFound},
		{"413 body-too-large is final", problem(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge), false, http.StatusRequestEntityTooLarge},
		{"415 unsupported-media-type is final", problem(http.StatusUnsupportedMediaType, ProblemUnsupportedMedia), false, http.StatusUnsupportedMediaType},
		{"500 execution-failed is final", problem(http.StatusInternalServerError, ProblemExecutionFailed), false, http.StatusInternalServerError},
		{"304 is final", status(http.StatusNotModified), false, http.StatusNotModified},
		{"200 is final", status(http.StatusOK), false, http.StatusOK},
		{"201 is final", func(_ *testing.T, w http.ResponseWriter) { writeCreated(w) }, false, http.StatusCreated},
	}
	for _, s := range senders {
		for _, row := range rows {
			t.Run(s.name+"/"+row.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
					if n == 1 {
						row.first(t, w)
						return
					}
					writeCreated(w)
				})
				resp, attempts, err := s.send(t, srv, fakePolicy(newSleeps()), context.Background(), `{"sku":"A"}`, NewKey())
				require.NoError(t, err)
				defer closeResp(t, resp)

				want, wantStatus := 1, row.final
				if row.retry {
					want, wantStatus = 2, http.StatusCreated
				}
				require.Equal(t, wantStatus, resp.StatusCode)
				require.Equal(t, want, srv.count(), "attempts seen by the server")
				if attempts >= 0 {
					require.Equal(t, want, attempts, "attempts reported")
				}
			})
		}
	}
}

// opaqueReader hides its type so http.NewRequest cannot set GetBody.
type opaqueReader struct{ io.Reader }

func TestKeyAndBodyBytesNeverChangeAcrossAttempts(t *testing.T) {
	t.Parallel()
	const payload = `{"sku":"A-1","qty":2,"note":"ünïcode"}`
	bodies := []struct {
		name string
		body func() io.Reader
	}{
		{"body with GetBody", func() io.Reader { return strings.NewReader(payload) }},
		{"body without GetBody", func() io.Reader { return opaqueReader{strings.NewReader(payload)} }},
	}
	for _, b := range bodies {
		for _, viaTransport := range []bool{false, true} {
			name := b.name + "/Client.Do"
			if viaTransport {
				name = b.name + "/Transport"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
					switch n {
					case 1:
						w.WriteHeader(http.StatusServiceUnavailable)
					case 2:
						dropConnection(t, w)
					case 3:
						writeProblem(w, http.StatusConflict, ProblemInProgress, "1")
					default:
						writeCreated(w)
					}
				})
				key := KeyFor("conv-1", "tool-call-9")
				req, err := http.NewRequest(http.MethodPost, srv.URL, b.body())
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")

				var resp *http.Response
				if viaTransport {
					hc := &http.Client{Transport: &Transport{Base: srv.Client().Transport, Policy: fakePolicy(newSleeps())}}
					resp, err = hc.Do(WithKey(req, key))
				} else {
					c := &Client{HTTP: srv.Client(), Policy: fakePolicy(newSleeps())}
					var res *Result
					res, err = c.Do(context.Background(), req, key)
					if res != nil {
						resp = res.Response
					}
					require.Empty(t, req.Header.Get(DefaultHeaderName), "the caller's request is not modified")
				}
				require.NoError(t, err)
				defer closeResp(t, resp)
				require.Equal(t, http.StatusCreated, resp.StatusCode)

				got := srv.seen()
				require.Len(t, got, 4)
				for i, a := range got {
					require.Equal(t, key, a.key, "attempt %d key", i+1)
					require.Equal(t, 1, a.keyVals, "attempt %d sends exactly one key", i+1)
					require.Equal(t, sha256.Sum256([]byte(payload)), a.sum, "attempt %d body", i+1)
					require.Equal(t, int64(len(payload)), a.length, "attempt %d Content-Length", i+1)
				}
			})
		}
	}
}

func TestRetryAfterIsHonouredInsteadOfBackoff(t *testing.T) {
	t.Parallel()
	start := newSleeps().Now()
	rows := []struct {
		name       string
		status     int
		kind       string
		retryAfter string
		want       time.Duration
	}{
		{"429 Retry-After seconds", http.StatusTooManyRequests, "", "7", 7 * time.Second},
		{"409 in-progress Retry-After seconds", http.StatusConflict, ProblemInProgress, "2", 2 * time.Second},
		{"503 Retry-After HTTP-date", http.StatusServiceUnavailable, ProblemStoreUnavailable,
			start.Add(10 * time.Second).Format(http.TimeFormat), 10 * time.Second},
		{"Retry-After above MaxDelay is not capped", http.StatusServiceUnavailable, "", "8", 8 * time.Second},
		{"no Retry-After uses jittered backoff", http.StatusBadGateway, "", "", 50 * time.Millisecond},
		{"Retry-After 0 uses jittered backoff", http.StatusServiceUnavailable, "", "0", 50 * time.Millisecond},
		{"past HTTP-date uses jittered backoff", http.StatusServiceUnavailable, "",
			start.Add(-time.Minute).Format(http.TimeFormat), 50 * time.Millisecond},
		{"malformed Retry-After uses jittered backoff", http.StatusTooManyRequests, "", "soon", 50 * time.Millisecond},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n > 1 {
					writeCreated(w)
					return
				}
				if row.kind != "" {
					writeProblem(w, row.status, row.kind, row.retryAfter)
					return
				}
				if row.retryAfter != "" {
					w.Header().Set("Retry-After", row.retryAfter)
				}
				w.WriteHeader(row.status)
			})
			clock := newSleeps()
			p := fakePolicy(clock) // InitialDelay 100ms, jitter 0.5
			res, err := (&Client{HTTP: srv.Client(), Policy: p}).Do(context.Background(),
				mustRequest(t, srv.URL, "{}"), NewKey())
			require.NoError(t, err)
			defer closeResp(t, res.Response)
			require.Equal(t, http.StatusCreated, res.Response.StatusCode)
			require.Equal(t, 2, res.Attempts)
			require.Equal(t, []time.Duration{row.want}, clock.recorded())
		})
	}
}

func TestRetryAfterBeyondTheBudgetReturnsTheLastResponseAtOnce(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusConflict, ProblemInProgress, "60")
	})
	clock := newSleeps()
	p := fakePolicy(clock)
	p.MaxElapsed = 5 * time.Second
	res, err := (&Client{HTTP: srv.Client(), Policy: p}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
	require.NoError(t, err)
	defer closeResp(t, res.Response)
	require.Equal(t, http.StatusConflict, res.Response.StatusCode)
	require.Equal(t, ProblemInProgress, res.Problem.Kind())
	require.Equal(t, "60", res.Response.Header.Get("Retry-After"), "the caller can still schedule a later retry")
	require.Equal(t, 1, res.Attempts)
	require.Equal(t, 1, srv.count())
	require.Empty(t, clock.recorded())
}

func TestBackoffIsExponentialWithFullJitterAndCapped(t *testing.T) {
	t.Parallel()
	rows := []struct {
		name   string
		jitter float64
		want   []time.Duration
	}{
		{"jitter 1 reaches the ceiling", 1, []time.Duration{100, 200, 400, 800, 1000}},
		{"jitter 0.25 scales every wait", 0.25, []time.Duration{25, 50, 100, 200, 250}},
		{"jitter 0 retries at once", 0, []time.Duration{0, 0, 0, 0, 0}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			clock := newSleeps()
			p := fakePolicy(clock)
			p.InitialDelay, p.MaxDelay, p.MaxAttempts = 100*time.Millisecond, time.Second, 6
			p.Rand = func() float64 { return row.jitter }
			res, err := (&Client{HTTP: srv.Client(), Policy: p}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
			require.NoError(t, err)
			defer closeResp(t, res.Response)
			require.Equal(t, http.StatusServiceUnavailable, res.Response.StatusCode)
			require.Equal(t, 6, res.Attempts)
			require.Equal(t, 6, srv.count())
			want := make([]time.Duration, len(row.want))
			for i, ms := range row.want {
				want[i] = ms * time.Millisecond
			}
			require.Equal(t, want, clock.recorded())
		})
	}
}

func TestBackoffStaysWithinMaxDelayForAnyAttempt(t *testing.T) {
	t.Parallel()
	p := Policy{InitialDelay: time.Hour, MaxDelay: maxDuration, Rand: func() float64 { return 1 }}.withDefaults()
	for _, attempt := range []int{1, 2, 40, 64, 1000} {
		d := p.backoff(attempt)
		require.Positive(t, d, "attempt %d", attempt)
		require.LessOrEqual(t, d, p.MaxDelay, "attempt %d", attempt)
	}
	p.Rand = func() float64 { return 7 } // a broken jitter source cannot exceed the cap
	require.Equal(t, time.Hour, p.backoff(1))
}

func TestMaxElapsedStopsRetriesOnAFakeClock(t *testing.T) {
	t.Parallel()
	// Each wait is exactly 1s: attempts start at 0s, 1s, ..., 5s; a seventh
	// would start at 6s, past the 5s budget.
	policy := func(clock *sleeps) Policy {
		p := fakePolicy(clock)
		p.InitialDelay, p.MaxDelay, p.MaxElapsed = time.Second, time.Second, 5*time.Second
		p.Rand = func() float64 { return 1 }
		return p
	}
	t.Run("last response is returned unchanged", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable, "")
		})
		clock := newSleeps()
		res, err := (&Client{HTTP: srv.Client(), Policy: policy(clock)}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
		require.NoError(t, err)
		defer closeResp(t, res.Response)
		require.Equal(t, 6, res.Attempts)
		require.Equal(t, 6, srv.count())
		require.Len(t, clock.recorded(), 5)
		require.Equal(t, ProblemStoreUnavailable, res.Problem.Kind())
		body, err := io.ReadAll(res.Response.Body)
		require.NoError(t, err)
		require.Contains(t, string(body), ProblemStoreUnavailable, "the body is intact")
	})
	for _, s := range senders {
		t.Run("last transport error wraps ErrGaveUp/"+s.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { dropConnection(t, w) })
			clock := newSleeps()
			resp, _, err := s.send(t, srv, policy(clock), context.Background(), "{}", NewKey())
			closeResp(t, resp)
			require.ErrorIs(t, err, ErrGaveUp)
			require.ErrorContains(t, err, "after 6 attempts")
			require.ErrorContains(t, err, "EOF", "the last transport error is kept")
			require.Equal(t, 6, srv.count())
		})
	}
}

func TestMaxAttemptsLimitsAttempts(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	})
	clock := newSleeps()
	p := fakePolicy(clock)
	p.MaxAttempts = 3
	res, err := (&Client{HTTP: srv.Client(), Policy: p}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
	require.NoError(t, err)
	defer closeResp(t, res.Response)
	require.Equal(t, http.StatusBadGateway, res.Response.StatusCode)
	require.Equal(t, 3, res.Attempts)
	require.Equal(t, 3, srv.count())
	require.Len(t, clock.recorded(), 2)
}

func TestMaxElapsedStopsRetriesInRealTime(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	p := Policy{MaxElapsed: 150 * time.Millisecond, InitialDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond}
	began := time.Now()
	res, err := (&Client{HTTP: srv.Client(), Policy: p}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
	elapsed := time.Since(began)
	require.NoError(t, err)
	defer closeResp(t, res.Response)
	require.Equal(t, http.StatusServiceUnavailable, res.Response.StatusCode)
	require.Greater(t, res.Attempts, 1)
	require.Equal(t, res.Attempts, srv.count())
	require.Less(t, elapsed, 2*time.Second)
}

func TestRefusedRedirectIsFinal(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	hc := srv.Client()
	refused := errors.New("redirects are not followed")
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return refused }
	res, err := (&Client{HTTP: hc, Policy: fakePolicy(newSleeps())}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
	require.Nil(t, res)
	require.ErrorIs(t, err, refused)
	require.Equal(t, 1, srv.count())
}

func TestPerAttemptTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // hang until the client's per-attempt timeout fires
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		writeCreated(w)
	})
	hc := srv.Client()
	hc.Timeout = 100 * time.Millisecond
	res, err := (&Client{HTTP: hc, Policy: fakePolicy(newSleeps())}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
	require.NoError(t, err)
	defer closeResp(t, res.Response)
	require.Equal(t, http.StatusCreated, res.Response.StatusCode)
	require.Equal(t, 2, res.Attempts)
	require.Equal(t, 2, srv.count())
}

func TestCallerContextStopsRetrying(t *testing.T) {
	t.Parallel()
	for _, s := range senders {
		t.Run("cancel while waiting/"+s.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				writeProblem(w, http.StatusConflict, ProblemInProgress, "30")
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			time.AfterFunc(50*time.Millisecond, cancel)
			began := time.Now()
			resp, _, err := s.send(t, srv, Policy{MaxElapsed: time.Minute}, ctx, "{}", NewKey())
			closeResp(t, resp)
			require.ErrorIs(t, err, context.Canceled)
			require.Less(t, time.Since(began), 5*time.Second, "the 30s Retry-After was not waited out")
			require.Equal(t, 1, srv.count())
		})
		t.Run("cancel during an attempt/"+s.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			time.AfterFunc(50*time.Millisecond, cancel)
			resp, _, err := s.send(t, srv, fakePolicy(newSleeps()), ctx, "{}", NewKey())
			closeResp(t, resp)
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, 1, srv.count())
		})
		t.Run("deadline while waiting/"+s.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "30")
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			resp, _, err := s.send(t, srv, Policy{MaxElapsed: time.Minute}, ctx, "{}", NewKey())
			closeResp(t, resp)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Equal(t, 1, srv.count())
		})
		t.Run("already cancelled sends nothing/"+s.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { writeCreated(w) })
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			resp, _, err := s.send(t, srv, fakePolicy(newSleeps()), ctx, "{}", NewKey())
			closeResp(t, resp)
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, 0, srv.count())
		})
	}
}

func TestMissingOrInvalidKeySendsNothing(t *testing.T) {
	t.Parallel()
	rows := []struct {
		name string
		key  string
		want error
	}{
		{"no key", "", ErrNoKey},
		{"key with a space", "order 1", ErrInvalidKey},
		{"non-ASCII key", "commande-é", ErrInvalidKey},
		{"key over 255 chars", strings.Repeat("k", 256), ErrInvalidKey},
	}
	for _, s := range senders {
		for _, row := range rows {
			t.Run(s.name+"/"+row.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { writeCreated(w) })
				resp, _, err := s.send(t, srv, fakePolicy(newSleeps()), context.Background(), "{}", row.key)
				closeResp(t, resp)
				require.ErrorIs(t, err, row.want)
				require.Equal(t, 0, srv.count())
			})
		}
	}
	t.Run("Transport/two key values", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { writeCreated(w) })
		req := mustRequest(t, srv.URL, "{}")
		req.Header.Add(DefaultHeaderName, "a")
		req.Header.Add(DefaultHeaderName, "b")
		resp, err := (&Transport{Base: srv.Client().Transport}).RoundTrip(req)
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrInvalidKey)
		require.Equal(t, 0, srv.count())
	})
	t.Run("Transport/custom header name is required", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { writeCreated(w) })
		req := WithKey(mustRequest(t, srv.URL, "{}"), NewKey()) // sets the default name only
		resp, err := (&Transport{Base: srv.Client().Transport, Policy: Policy{HeaderName: "X-Idempotency-Key"}}).RoundTrip(req)
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrNoKey)
		require.Equal(t, 0, srv.count())
	})
	t.Run("Transport/closes the body it refuses", func(t *testing.T) {
		t.Parallel()
		body := &closeTracker{Reader: strings.NewReader("{}")}
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", body)
		require.NoError(t, err)
		resp, err := (&Transport{}).RoundTrip(req)
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrNoKey)
		require.True(t, body.closed)
	})
}

type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error {
	c.closed = true
	return nil
}

func TestReplayedIsReported(t *testing.T) {
	t.Parallel()
	for _, replayed := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh answer", true: "replayed answer"}[replayed], func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				if replayed {
					w.Header().Set(ReplayedHeader, "true")
				}
				writeCreated(w)
			})
			res, err := (&Client{HTTP: srv.Client()}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
			require.NoError(t, err)
			defer closeResp(t, res.Response)
			require.Equal(t, replayed, res.Replayed)
			require.Equal(t, replayed, Replayed(res.Response))
			require.Equal(t, 1, res.Attempts)
		})
	}
	t.Run("nil response is not a replay", func(t *testing.T) {
		t.Parallel()
		require.False(t, Replayed(nil))
	})
}

func TestProblemIsParsedAndTheBodyStaysReadable(t *testing.T) {
	t.Parallel()
	t.Run("key-reused problem", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "")
		})
		res, err := (&Client{HTTP: srv.Client()}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
		require.NoError(t, err)
		defer closeResp(t, res.Response)
		require.Equal(t, &Problem{Type: ProblemTypePrefix + ProblemKeyReused, Title: "t", Status: 422, Detail: "d"}, res.Problem)
		require.Equal(t, ProblemKeyReused, res.Problem.Kind())
		body, err := io.ReadAll(res.Response.Body)
		require.NoError(t, err)
		require.JSONEq(t, `{"type":"urn:orderguard:problem:key-reused","title":"t","status":422,"detail":"d"}`, string(body))
	})
	t.Run("success has no problem", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { writeCreated(w) })
		res, err := (&Client{HTTP: srv.Client()}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
		require.NoError(t, err)
		defer closeResp(t, res.Response)
		require.Nil(t, res.Problem)
		body, err := io.ReadAll(res.Response.Body)
		require.NoError(t, err)
		require.JSONEq(t, `{"order_id":"o-1"}`, string(body))
	})
	t.Run("oversized problem is not parsed but fully readable", func(t *testing.T) {
		t.Parallel()
		big := `{"type":"x","detail":"` + strings.Repeat("z", maxProblemBytes) + `"}`
		srv := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, big)
		})
		res, err := (&Client{HTTP: srv.Client()}).Do(context.Background(), mustRequest(t, srv.URL, "{}"), NewKey())
		require.NoError(t, err)
		defer closeResp(t, res.Response)
		require.Nil(t, res.Problem)
		body, err := io.ReadAll(res.Response.Body)
		require.NoError(t, err)
		require.Equal(t, big, string(body))
	})
	t.Run("kind of a foreign or nil problem is empty", func(t *testing.T) {
		t.Parallel()
		require.Empty(t, (&Problem{Type: "about:blank"}).Kind())
		require.Empty(t, (&Problem{Type: ProblemInProgress}).Kind())
		require.Empty(t, (*Problem)(nil).Kind())
	})
}

func TestPostJSONSendsJSONUnderTheKey(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		writeCreated(w)
	})
	key := KeyFor("run-7", "create-order")
	res, err := (&Client{HTTP: srv.Client(), Policy: fakePolicy(newSleeps())}).PostJSON(context.Background(), srv.URL, key,
		map[string]any{"sku": "A-1", "qty": 2})
	require.NoError(t, err)
	defer closeResp(t, res.Response)
	require.Equal(t, http.StatusCreated, res.Response.StatusCode)
	require.Equal(t, 2, res.Attempts)
	want := sha256.Sum256([]byte(`{"qty":2,"sku":"A-1"}`))
	for _, a := range srv.seen() {
		require.Equal(t, key, a.key)
		require.Equal(t, want, a.sum)
		require.Equal(t, "application/json", a.contentType)
	}
}

func TestPostJSONRejectsUnencodableBody(t *testing.T) {
	t.Parallel()
	_, err := (&Client{}).PostJSON(context.Background(), "http://127.0.0.1:1/", NewKey(), func() {})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrNoKey))
}

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{" 3 ", 3 * time.Second, true},
		{"0", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"99999999999999999999", 0, false}, // overflows uint64: malformed
		{"9999999999999", maxDuration, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Format(http.TimeFormat), 0, false},
		{"tomorrow", 0, false},
	}
	for _, row := range rows {
		h := http.Header{}
		if row.value != "" {
			h.Set("Retry-After", row.value)
		}
		d, ok := retryAfter(h, now)
		require.Equal(t, row.ok, ok, "%q", row.value)
		if ok {
			require.Equal(t, row.want, d, "%q", row.value)
		}
	}
}

func mustRequest(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return req
}
