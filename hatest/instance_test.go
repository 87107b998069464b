package hatest_test

// An instance is the example order service on its own pool, as a deployment
// runs one per application server; an answer is what its client received.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/logcount"
	"github.com/orderguard/idempotency/postgres"
)

// userID is the principal of every request: the scope of every key.
const userID = 7

var scope = strconv.Itoa(userID)

type instance struct {
	n      int
	srv    *httptest.Server
	client *http.Client
}

// instances serves the order service three times, each on a pool of its
// own from postgres.Open(dsn), with cfg (the instance fills in InstanceID
// and Logger, which writes to logs). The first migrates and seeds the
// schema dsn names.
func instances(t *testing.T, dsn string, cfg idempotency.Config, logs *logcount.Causes) []*instance {
	t.Helper()
	var ins []*instance
	for n := 1; n <= 3; n++ {
		db, err := postgres.Open(dsn)
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		if n == 1 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			require.NoError(t, orderservice.Setup(ctx, db, "postgres"))
			cancel()
		}
		ins = append(ins, serve(t, n, db, cfg, logs))
	}
	return ins
}

// serve serves the order service over db as instance n.
func serve(t *testing.T, n int, db *sql.DB, cfg idempotency.Config, logs *logcount.Causes) *instance {
	t.Helper()
	cfg.InstanceID = fmt.Sprintf("app%d", n)
	cfg.Logger = slog.New(logs)
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: true, Store: postgres.NewStore(db), Dialect: "postgres", Config: cfg,
	})
	require.NoError(t, err)
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	transport := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(transport.CloseIdleConnections)
	// The client's timeout is a safety net far beyond the bound the test
	// asserts (noHang): a request that hangs fails the test instead of
	// the run.
	return &instance{n: n, srv: srv, client: &http.Client{Timeout: 3 * noHang, Transport: transport}}
}

// answer is one response, as its client saw it.
type answer struct {
	instance   int
	key        string
	attempt    int
	status     int
	retryAfter string
	kind       string // a problem's kind
	replayed   bool
	orderNo    string // for 201
	err        error  // transport failure
	start, end time.Time
}

func (a answer) took() time.Duration { return a.end.Sub(a.start) }

// create posts a create-order request for sku under key.
func (in *instance) create(key string, sku int64) answer {
	a := answer{instance: in.n, key: key, start: time.Now()}
	defer func() { a.end = time.Now() }()
	body := fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":1}`, userID, sku)
	req, err := http.NewRequest(http.MethodPost, in.srv.URL+"/orders", bytes.NewReader(body))
	if err != nil {
		a.err = err
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", scope)
	req.Header.Set("Idempotency-Key", key)
	resp, err := in.client.Do(req)
	if err != nil {
		a.err = err
		a.end = time.Now()
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a.end = time.Now()
	a.status, a.err = resp.StatusCode, err
	a.retryAfter = resp.Header.Get("Retry-After")
	a.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	switch {
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json"):
		var p idempotency.Problem
		if json.Unmarshal(b, &p) == nil {
			a.kind = p.Kind()
		}
	case a.status == http.StatusCreated:
		var o orderservice.OrderResponse
		if json.Unmarshal(b, &o) == nil {
			a.orderNo = o.OrderNo
		}
	}
	return a
}

// get reads order orderNo.
func (in *instance) get(orderNo string) answer {
	a := answer{instance: in.n, key: "GET " + orderNo, start: time.Now()}
	req, err := http.NewRequest(http.MethodGet, in.srv.URL+"/orders/"+orderNo, nil)
	if err != nil {
		a.err = err
		return a
	}
	req.Header.Set("X-User-ID", scope)
	resp, err := in.client.Do(req)
	if err != nil {
		a.err = err
		a.end = time.Now()
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a.end = time.Now()
	a.status, a.err = resp.StatusCode, err
	a.retryAfter = resp.Header.Get("Retry-After")
	var p idempotency.Problem
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") && json.Unmarshal(b, &p) == nil {
		a.kind = p.Kind()
	}
	return a
}

// conforms reports whether a is an answer the contract allows during a
// failover: 201, or 503 or 409 in-progress with Retry-After, which tell the
// client to retry with the same key.
func (a answer) conforms() bool {
	switch {
	case a.err != nil:
		return false
	case a.status == http.StatusCreated:
		return a.orderNo != ""
	case a.status == http.StatusConflict:
		return a.kind == idempotency.ProblemInProgress && a.retryAfter != ""
	case a.status == http.StatusServiceUnavailable:
		return a.retryAfter != ""
	}
	return false
}

func retryable(a answer) bool {
	return a.status == http.StatusServiceUnavailable ||
		a.status == http.StatusConflict && a.kind == idempotency.ProblemInProgress
}

// label names a for tallies: the status and, for a problem, its kind.
func (a answer) label() string {
	switch {
	case a.err != nil:
		return "transport error"
	case a.kind != "":
		s := fmt.Sprintf("%d %s", a.status, a.kind)
		if a.retryAfter == "" {
			s += " (no Retry-After)"
		}
		return s
	case a.replayed:
		return fmt.Sprintf("%d replayed", a.status)
	}
	return strconv.Itoa(a.status)
}

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("instance %d, key %s, attempt %d: %v", a.instance, a.key, a.attempt, a.err)
	}
	return fmt.Sprintf("instance %d, key %s, attempt %d: %s, Retry-After %q, in %v", a.instance, a.key, a.attempt,
		a.label(), a.retryAfter, a.took().Round(time.Millisecond))
}

// tally counts answers by label, most frequent first.
func tally(answers []answer) string {
	counts := map[string]int{}
	for _, a := range answers {
		counts[a.label()]++
	}
	labels := make([]string, 0, len(counts))
	for k := range counts {
		labels = append(labels, k)
	}
	slices.SortFunc(labels, func(x, y string) int {
		if counts[x] != counts[y] {
			return counts[y] - counts[x]
		}
		return strings.Compare(x, y)
	})
	parts := make([]string, len(labels))
	for i, k := range labels {
		parts[i] = fmt.Sprintf("%s ×%d", k, counts[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
