package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// testBundle is a real order service over a fresh MariaDB database, served on
// loopback.
type testBundle struct {
	db  *sql.DB
	srv *httptest.Server
}

func setup(t *testing.T, cfg idempotency.Config, delay time.Duration) *testBundle {
	t.Helper()
	return setupWith(t, orderservice.Options{Config: cfg, HandlerDelay: delay})
}

// setupWith is setup with the order service's options (Idempotency and
// Store are set here).
func setupWith(t *testing.T, opts orderservice.Options) *testBundle {
	t.Helper()
	db := newMySQL(t)
	require.NoError(t, orderservice.Setup(context.Background(), db, "mysql"))
	opts.Idempotency, opts.Store = true, idempotency.NewMySQLStore(db)
	svc, err := orderservice.New(db, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	return &testBundle{db: db, srv: srv}
}

// answer is a response read in full.
type answer struct {
	Status int
	Header http.Header
	Body   string
}

func (a answer) problemType(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", a.Header.Get("Content-Type"), "body: %s", a.Body)
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(a.Body), &p))
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

type call struct {
	method, path, user, key, contentType, body string
}

func (b *testBundle) do(t *testing.T, c call) answer {
	t.Helper()
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/orders"
	}
	req, err := http.NewRequest(c.method, b.srv.URL+c.path, strings.NewReader(c.body))
	require.NoError(t, err)
	if c.user != "" {
		req.Header.Set("X-User-ID", c.user)
	}
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	if c.contentType == "" && c.body != "" {
		c.contentType = "application/json"
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	resp, err := rawClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

// rawClient shows the server's own answer: it does not follow redirects.
var rawClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// storm sends n copies of c at once and returns every answer.
func (b *testBundle) storm(t *testing.T, n int, c call) []answer {
	t.Helper()
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.do(t, c)
		}()
	}
	close(start)
	wg.Wait()
	return answers
}

func (b *testBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(query, args...).Scan(&n))
	return n
}

func (b *testBundle) orders(t *testing.T) int {
	return b.count(t, "SELECT COUNT(*) FROM purchase_order")
}

func (b *testBundle) records(t *testing.T) int {
	return b.count(t, "SELECT COUNT(*) FROM idempotency_record")
}

// forEachMode runs a specification against both modes: every rule of the
// protocol holds whether the key is claimed first or recorded at commit.
func forEachMode(t *testing.T, spec func(t *testing.T, mode idempotency.Mode)) {
	for name, mode := range map[string]idempotency.Mode{"claim-first": idempotency.ModeClaimFirst, "single-phase": idempotency.ModeSinglePhase} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec(t, mode)
		})
	}
}

func createBody(user, sku, qty int, extra string) string {
	return fmt.Sprintf(`{"user_id":%d,"sku_id":%d,"quantity":%d%s}`, user, sku, qty, extra)
}

func TestCreate_FirstRequest_Returns201WithOrderAndLocation(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)

		got := b.do(t, call{user: "7", key: "k-1", body: createBody(7, 20001, 2, `,"coupon_id":5`)})

		require.Equal(t, http.StatusCreated, got.Status, got.Body)
		var o orderservice.OrderResponse
		require.NoError(t, json.Unmarshal([]byte(got.Body), &o))
		require.Equal(t, "CREATED", o.Status)
		require.Equal(t, "/orders/"+o.OrderNo, got.Header.Get("Location"))
		require.Equal(t, orderservice.SKUPriceCents(20001), o.UnitPriceCents)
		require.EqualValues(t, orderservice.CouponDiscountCents, o.DiscountCents)
		require.Equal(t, 2*o.UnitPriceCents-o.DiscountCents, o.TotalCents)
		require.Empty(t, got.Header.Get("Idempotent-Replayed"))
		require.Equal(t, 1, b.orders(t))
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE'"))
	})
}

func TestReplay_SameKeySameBody_ReturnsByteIdenticalAnswer(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		first := b.do(t, call{user: "7", key: "k-1", body: createBody(7, 20001, 1, "")})
		require.Equal(t, http.StatusCreated, first.Status)

		// Key order, whitespace and volatile fields do not matter;
		// neither does a client-sent price.
		again := b.do(t, call{user: "7", key: "k-1",
			body: `{ "quantity": 1, "sku_id": 20001, "user_id": 7, "trace_id": "t-2", "timestamp": 99, "price": 1 }`})

		require.Equal(t, http.StatusCreated, again.Status)
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
		require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		require.Equal(t, 1, b.orders(t))
	})
}

func TestReplay_SameKeyDifferentBody_Returns409AndWritesNothing(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		require.Equal(t, http.StatusCreated, b.do(t, call{user: "7", key: "k-1", body: createBody(7, 20001, 1, "")}).Status)

		changes := map[string]string{
			"quantity":   createBody(7, 20001, 2, ""),
			"sku":        createBody(7, 20002, 1, ""),
			"coupon":     createBody(7, 20001, 1, `,"coupon_id":9`),
			"coupon-nil": createBody(7, 20001, 1, `,"coupon_id":null`), // absent == null: not a change
		}
		for name, body := range changes {
			got := b.do(t, call{user: "7", key: "k-1", body: body})
			if name == "coupon-nil" {
				require.Equal(t, http.StatusCreated, got.Status, name)
				continue
			}
			require.Equal(t, http.StatusConflict, got.Status, name)
			require.Equal(t, idempotency.ProblemKeyReused, got.problemType(t), name)
		}
		require.Equal(t, 1, b.orders(t))
		require.Equal(t, 0, b.count(t, "SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
	})
}

func TestReplay_ConflictStatus422_IsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{ConflictStatus: http.StatusUnprocessableEntity}, 0)
	require.Equal(t, http.StatusCreated, b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, "")}).Status)
	got := b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 3, "")})
	require.Equal(t, http.StatusUnprocessableEntity, got.Status)
	require.Equal(t, idempotency.ProblemKeyReused, got.problemType(t))
}

func TestConcurrency_64RequestsOneKey_ExactlyOneOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, 50*time.Millisecond)
	const n = 64
	answers := b.storm(t, n, call{user: "7", key: "storm", body: createBody(7, 20001, 1, "")})

	require.Equal(t, 1, b.orders(t))
	var created string
	var inProgress int
	for _, a := range answers {
		switch a.Status {
		case http.StatusCreated:
			if created == "" {
				created = a.Body
			}
			require.Equal(t, created, a.Body, "every 201 carries the same order")
		case http.StatusConflict:
			require.Equal(t, idempotency.ProblemInProgress, a.problemType(t))
			require.NotEmpty(t, a.Header.Get("Retry-After"))
			inProgress++
		default:
			t.Fatalf("unexpected answer %d: %s", a.Status, a.Body)
		}
	}
	require.NotEmpty(t, created)
	t.Logf("%d created/replayed, %d in progress", n-inProgress, inProgress)
}

func TestConcurrency_200DistinctKeys_200Orders(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		const n = 200
		var wg sync.WaitGroup
		var created atomic.Int32
		sem := make(chan struct{}, 32)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				user := 1 + i%10
				a := b.do(t, call{user: fmt.Sprint(user), key: fmt.Sprintf("key-%d", i), body: createBody(user, 20001+i%100, 1, "")})
				if a.Status == http.StatusCreated {
					created.Add(1)
				} else {
					t.Errorf("key-%d: %d %s", i, a.Status, a.Body)
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, n, created.Load())
		require.Equal(t, n, b.orders(t))
	})
}

func TestBadInput_IsRefusedBeforeTheClaim_AndWritesNothing(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode, MaxBodyBytes: 1024}, 0)
		valid := createBody(7, 20001, 1, "")
		cases := []struct {
			name   string
			call   call
			status int
			kind   string
		}{
			{"missing key", call{user: "7", body: valid}, 400, idempotency.ProblemMissingKey},
			{"key with space", call{user: "7", key: "a b", body: valid}, 400, idempotency.ProblemInvalidKey},
			{"key too long", call{user: "7", key: strings.Repeat("k", 256), body: valid}, 400, idempotency.ProblemInvalidKey},
			{"key not ascii", call{user: "7", key: "clé", body: valid}, 400, idempotency.ProblemInvalidKey},
			{"no user", call{key: "k", body: valid}, 401, idempotency.ProblemScopeRequired},
			{"other user's order", call{user: "8", key: "k", body: valid}, 403, orderservice.ProblemForbidden},
			{"malformed json", call{user: "7", key: "k", body: `{"user_id":7,`}, 400, idempotency.ProblemInvalidBody},
			{"duplicate json field", call{user: "7", key: "k", body: `{"user_id":7,"sku_id":20001,"quantity":1,"quantity":2}`}, 400, idempotency.ProblemInvalidBody},
			{"body too large", call{user: "7", key: "k", body: `{"user_id":7,"sku_id":20001,"quantity":1,"pad":"` + strings.Repeat("x", 2000) + `"}`}, 413, idempotency.ProblemBodyTooLarge},
			{"not json", call{user: "7", key: "k", contentType: "text/plain", body: valid}, 415, idempotency.ProblemUnsupportedMedia},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				got := b.do(t, c.call)
				require.Equal(t, c.status, got.Status, got.Body)
				require.Equal(t, c.kind, got.problemType(t))
			})
		}
		require.Equal(t, 0, b.records(t))
		require.Equal(t, 0, b.orders(t))
	})
}

func TestScope_SameKeyTwoUsers_TwoIndependentOrders(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		alice := b.do(t, call{user: "1", key: "shared", body: createBody(1, 20001, 1, "")})
		bob := b.do(t, call{user: "2", key: "shared", body: createBody(2, 20005, 3, "")})
		require.Equal(t, http.StatusCreated, alice.Status)
		require.Equal(t, http.StatusCreated, bob.Status, "another scope's record never conflicts")
		require.NotEqual(t, alice.Body, bob.Body)
		require.Equal(t, 2, b.orders(t))

		// And each scope replays only its own.
		again := b.do(t, call{user: "2", key: "shared", body: createBody(2, 20005, 3, "")})
		require.Equal(t, bob.Body, again.Body)
	})
}

func TestCancel_ThenRetriedCreate_ReplaysOriginalAndCreatesNothing(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		created := b.do(t, call{user: "7", key: "buy", body: createBody(7, 20001, 1, "")})
		require.Equal(t, http.StatusCreated, created.Status)
		location := created.Header.Get("Location")

		canceled := b.do(t, call{user: "7", key: "cancel-1", path: location + "/cancel"})
		require.Equal(t, http.StatusOK, canceled.Status, canceled.Body)
		require.Contains(t, canceled.Body, `"status":"CANCELED"`)

		retried := b.do(t, call{user: "7", key: "buy", body: createBody(7, 20001, 1, "")})
		require.Equal(t, http.StatusCreated, retried.Status)
		require.Equal(t, created.Body, retried.Body)
		require.Equal(t, 1, b.orders(t))
		read := b.do(t, call{method: http.MethodGet, user: "7", path: location})
		require.Contains(t, read.Body, `"status":"CANCELED"`, "the canceled order is not revived")

		// Pay after cancel is an invalid transition, and a retried cancel replays.
		pay := b.do(t, call{user: "7", key: "pay-1", path: location + "/pay"})
		require.Equal(t, http.StatusConflict, pay.Status)
		require.Equal(t, orderservice.ProblemInvalidTransition, pay.problemType(t))
		again := b.do(t, call{user: "7", key: "cancel-1", path: location + "/cancel"})
		require.Equal(t, canceled.Body, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	})
}

func TestGetOrder_OtherUser_Gets404(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, 0)
	created := b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, "")})
	location := created.Header.Get("Location")
	require.Equal(t, http.StatusOK, b.do(t, call{method: http.MethodGet, user: "7", path: location}).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, call{method: http.MethodGet, user: "8", path: location}).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, call{user: "8", key: "x", path: location + "/cancel"}).Status)
}

func TestBusinessRejection_4xx_IsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		cases := map[string]string{
			"unknown sku":    createBody(7, 99999, 1, ""),
			"quantity 0":     createBody(7, 20001, 0, ""),
			"quantity 101":   createBody(7, 20001, 101, ""),
			"unknown coupon": createBody(7, 20001, 1, `,"coupon_id":5000`),
		}
		for name, body := range cases {
			t.Run(name, func(t *testing.T) {
				key := "rej-" + strings.ReplaceAll(name, " ", "-")
				first := b.do(t, call{user: "7", key: key, body: body})
				require.Equal(t, http.StatusUnprocessableEntity, first.Status, first.Body)
				again := b.do(t, call{user: "7", key: key, body: body})
				require.Equal(t, first.Status, again.Status)
				require.Equal(t, first.Body, again.Body)
				require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			})
		}
		require.Equal(t, 0, b.orders(t))
		require.Equal(t, len(cases), b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'FAILED'"))
	})
}

func TestCoupon_UsedOnce_SecondOrderGets422(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b := setup(t, idempotency.Config{Mode: mode}, 0)
		require.Equal(t, http.StatusCreated, b.do(t, call{user: "7", key: "a", body: createBody(7, 20001, 1, `,"coupon_id":3`)}).Status)
		got := b.do(t, call{user: "7", key: "b", body: createBody(7, 20001, 1, `,"coupon_id":3`)})
		require.Equal(t, http.StatusUnprocessableEntity, got.Status)
		require.Equal(t, orderservice.ProblemCouponUnavailable, got.problemType(t))
		require.Equal(t, 1, b.orders(t))
	})
}

// flakyHandler answers 503 on its first n calls and then creates an order.
func flakyOrderServer(t *testing.T, failures int32, mode idempotency.Mode) (*testBundle, *atomic.Int32) {
	t.Helper()
	db := newMySQL(t)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: mode})
	require.NoError(t, err)
	var calls atomic.Int32
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		tx, _ := idempotency.TxFromContext(r.Context())
		scope, key, _ := idempotency.KeyFromContext(r.Context())
		o := &idempotency.Order{OrderNo: fmt.Sprintf("O-%d", n), Scope: scope, IdempotencyKey: key,
			UserID: 1, SKUID: 20001, Quantity: 1}
		if err := idempotency.CreateOrder(r.Context(), tx, o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if n <= failures {
			// The order row is written but the handler fails: it must roll back.
			http.Error(w, "downstream unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order_no":%q}`, o.OrderNo)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testBundle{db: db, srv: srv}, &calls
}

func TestServerError_5xx_RollsBackAndReleases_SoARetryExecutes(t *testing.T) {
	t.Parallel()
	forEachMode(t, testServerError)
}

func testServerError(t *testing.T, mode idempotency.Mode) {
	b, calls := flakyOrderServer(t, 1, mode)

	first := b.do(t, call{key: "k", body: `{}`})
	require.Equal(t, http.StatusServiceUnavailable, first.Status, "the handler's own answer passes through")
	require.Equal(t, 0, b.orders(t), "the failed attempt's order rolled back")
	require.Equal(t, 0, b.records(t), "the key was released")

	second := b.do(t, call{key: "k", body: `{}`})
	require.Equal(t, http.StatusCreated, second.Status)
	require.EqualValues(t, 2, calls.Load())
	require.Equal(t, 1, b.orders(t))

	third := b.do(t, call{key: "k", body: `{}`})
	require.Equal(t, second.Body, third.Body)
	require.EqualValues(t, 2, calls.Load(), "a finished key never executes again")
}

func TestPanic_RollsBackReleasesAndAnswers500(t *testing.T) {
	t.Parallel()
	forEachMode(t, testPanic)
}

func testPanic(t *testing.T, mode idempotency.Mode) {
	db := newMySQL(t)
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{Mode: mode})
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		_, err := tx.Exec(`INSERT INTO purchase_order (order_no, scope, user_id, sku_id, quantity, unit_price_cents, discount_cents, total_cents, status)
VALUES ('P1', '', 1, 1, 1, 1, 0, 1, 'INIT')`)
		require.NoError(t, err)
		panic("boom")
	})))
	t.Cleanup(srv.Close)
	b := &testBundle{db: db, srv: srv}

	got := b.do(t, call{key: "k", body: `{}`})
	require.Equal(t, http.StatusInternalServerError, got.Status)
	require.Equal(t, idempotency.ProblemExecutionFailed, got.problemType(t))
	require.Equal(t, 0, b.orders(t))
	require.Equal(t, 0, b.records(t))
}

// createThenOutliveRetention creates an order under key "k" on a route with a
// one-second retention and waits until its record has expired.
func createThenOutliveRetention(t *testing.T, mode idempotency.Mode) (*testBundle, answer) {
	t.Helper()
	b := setup(t, idempotency.Config{Mode: mode, Lease: time.Second, Retention: time.Second}, 0)
	first := b.do(t, call{user: "7", key: "k", body: createBody(7, 20001, 1, "")})
	require.Equal(t, http.StatusCreated, first.Status)
	require.Eventually(t, func() bool {
		return b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE expires_at <= NOW(6)") == 1
	}, 5*time.Second, 20*time.Millisecond)
	return b, first
}

func TestRetention_ExpiredKey_IsNewAgain(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b, _ := createThenOutliveRetention(t, mode)

		// After retention the key is new: even different parameters execute. The
		// purchase_order row keeps its own UNIQUE (scope, key), so this second
		// order needs a database that forgot the first; the example's answer is
		// the duplicate-order 409, which proves the last line of defence holds.
		again := b.do(t, call{user: "7", key: "k", body: createBody(7, 20002, 1, "")})
		require.Equal(t, http.StatusConflict, again.Status, again.Body)
		require.Equal(t, "duplicate-order", again.problemType(t))
		require.Equal(t, 1, b.orders(t))
	})
}

func TestRetention_ExpiredKey_RenewedByConcurrentRequests_ExecutesExactlyOnce(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		b, first := createThenOutliveRetention(t, mode)
		// The order table forgets too (an archive job), so the renewed key's
		// execution can succeed: only the record decides.
		_, err := b.db.Exec("DELETE FROM purchase_order")
		require.NoError(t, err)

		renewal := call{user: "7", key: "k", body: createBody(7, 20002, 2, "")}
		answers := b.storm(t, 16, renewal)
		var created []string
		for _, got := range answers {
			switch got.Status {
			case http.StatusCreated:
				created = append(created, got.Body)
				require.JSONEq(t, created[0], got.Body, "every 201 is the one renewed order")
			case http.StatusConflict:
				require.Equal(t, idempotency.ProblemInProgress, got.problemType(t))
			default:
				t.Fatalf("unexpected answer %d: %s", got.Status, got.Body)
			}
		}
		require.NotEmpty(t, created)
		require.Equal(t, 1, b.orders(t), "one execution renewed the key")
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM purchase_order WHERE sku_id = 20002 AND quantity = 2"))
		require.Equal(t, 1, b.count(t, "SELECT COUNT(*) FROM idempotency_record WHERE status = 'DONE' AND expires_at > NOW(6)"))
		require.NotEqual(t, first.Body, created[0])

		replay := b.do(t, renewal)
		require.Equal(t, http.StatusCreated, replay.Status)
		require.JSONEq(t, created[0], replay.Body)
		require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	})
}
