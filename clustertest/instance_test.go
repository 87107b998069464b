package clustertest_test

// An instance is the example order service on one node, as a deployment runs
// one per application server; an answer is what its client received.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/logcount"
)

// modes are the middleware's recording modes; tests where both matter run
// one subtest per mode.
var modes = []struct {
	name string
	mode idempotency.Mode
}{
	{"claim-first", idempotency.ModeClaimFirst},
	{"single-phase", idempotency.ModeSinglePhase},
}

// userID is the principal of every request: the scope of every key.
const userID = 7

var scope = strconv.Itoa(userID)

type instance struct {
	node       int
	srv        *httptest.Server
	client     *http.Client
	executions atomic.Int64 // create handlers that wrote an order, committed or not
	causes     *logcount.Causes
}

// instance serves the order service over node n with cfg (Mode and Lease;
// the instance fills in its InstanceID and Logger).
func (c *cluster) instance(t *testing.T, n int, cfg idempotency.Config) *instance {
	t.Helper()
	in := &instance{node: n, causes: logcount.New()}
	cfg.InstanceID = fmt.Sprintf("node%d", n)
	cfg.Logger = slog.New(in.causes)
	svc, err := orderservice.New(c.app[n], orderservice.Options{
		Idempotency: true,
		Store:       idempotency.NewMySQLStore(c.app[n]),
		Config:      cfg,
		AfterCreate: func(context.Context) error { in.executions.Add(1); return nil },
	})
	require.NoError(t, err)
	in.srv = httptest.NewServer(svc)
	t.Cleanup(in.srv.Close)
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(transport.CloseIdleConnections)
	in.client = &http.Client{Timeout: 60 * time.Second, Transport: transport}
	return in
}

// answer is one response, as its client saw it.
type answer struct {
	instance   int // the node the instance writes to
	key        string
	status     int
	body       []byte
	retryAfter string
	replayed   bool
	problem    idempotency.Problem // for application/problem+json
	orderNo    string              // for 201
	err        error               // transport failure
	start, end time.Time
}

// createBody is a create-order request of userID for sku.
func createBody(sku int64) []byte {
	return fmt.Appendf(nil, `{"user_id":%d,"sku_id":%d,"quantity":1}`, userID, sku)
}

// createOrder posts body under key and returns the answer.
func (in *instance) createOrder(ctx context.Context, key string, body []byte) answer {
	a := answer{instance: in.node, key: key, start: time.Now()}
	defer func() { a.end = time.Now() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.srv.URL+"/orders", bytes.NewReader(body))
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
	a.status = resp.StatusCode
	a.body, a.err = io.ReadAll(resp.Body)
	a.retryAfter = resp.Header.Get("Retry-After")
	a.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	switch {
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json"):
		_ = json.Unmarshal(a.body, &a.problem)
	case a.status == http.StatusCreated:
		var o orderservice.OrderResponse
		if json.Unmarshal(a.body, &o) == nil {
			a.orderNo = o.OrderNo
		}
	}
	a.end = time.Now()
	return a
}

// conforms reports whether a is an answer the contract allows under
// contention or failure: 201, or 409 in-progress or 503 with Retry-After,
// which tell the client to retry with the same key.
func (a answer) conforms() bool {
	switch {
	case a.err != nil:
		return false
	case a.status == http.StatusCreated:
		return true
	case a.status == http.StatusConflict:
		return a.problem.Kind() == idempotency.ProblemInProgress && a.retryAfter != ""
	case a.status == http.StatusServiceUnavailable:
		return a.retryAfter != ""
	}
	return false
}

// kind labels a for tallies: the status and, for a problem, its kind.
func (a answer) kind() string {
	switch {
	case a.err != nil:
		return "transport error"
	case a.problem.Type != "":
		s := fmt.Sprintf("%d %s", a.status, a.problem.Kind())
		if a.retryAfter == "" && a.status != http.StatusCreated {
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
		return fmt.Sprintf("instance %d, key %s: %v", a.instance, a.key, a.err)
	}
	if a.problem.Type != "" {
		return fmt.Sprintf("instance %d, key %s: %d %s, Retry-After %q: %s", a.instance, a.key, a.status, a.problem.Type, a.retryAfter, a.problem.Detail)
	}
	return fmt.Sprintf("instance %d, key %s: %d %s", a.instance, a.key, a.status, bytes.TrimSpace(a.body))
}

// tally counts answers by kind, most frequent first.
func tally(answers []answer) string {
	counts := map[string]int{}
	for _, a := range answers {
		counts[a.kind()]++
	}
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(x, y string) int {
		if counts[x] != counts[y] {
			return counts[y] - counts[x]
		}
		return strings.Compare(x, y)
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s ×%d", k, counts[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// reportNonConforming fails the test with every answer outside the
// contract, grouped by what was answered, a few examples each.
func reportNonConforming(t *testing.T, what string, answers []answer) {
	t.Helper()
	byKind := map[string][]answer{}
	var kinds []string
	for _, a := range answers {
		if a.conforms() {
			continue
		}
		k := a.kind()
		if _, ok := byKind[k]; !ok {
			kinds = append(kinds, k)
		}
		byKind[k] = append(byKind[k], a)
	}
	for _, k := range kinds {
		examples := byKind[k][:min(3, len(byKind[k]))]
		lines := make([]string, len(examples))
		for i, a := range examples {
			lines[i] = "    " + a.String()
		}
		t.Errorf("%s: %d answers %s, not 201 nor 409 in-progress / 503 with Retry-After; e.g.\n%s",
			what, len(byKind[k]), k, strings.Join(lines, "\n"))
	}
}

// logCauses prints what the instance's middleware logged, most frequent
// first.
func (in *instance) logCauses(t *testing.T) {
	t.Helper()
	in.causes.Log(t, fmt.Sprintf("instance %d logged", in.node), 8)
}
