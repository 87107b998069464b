package idemecho_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	idemecho "github.com/orderguard/idempotency/adapters/echo"
	"github.com/orderguard/idempotency/internal/testdb"
)

// testBundle is a real echo server on loopback over a fresh MariaDB
// database:
//
//	outer (in front) → the middleware under test → inner → the handler
//
// outer records what the middleware left behind; the counters say what of
// the protected chain ran.
type testBundle struct {
	db  *sql.DB
	srv *httptest.Server

	inner, creates atomic.Int32

	mu   sync.Mutex
	seen outerView // after the last request
}

// outerView is what middleware in front of the middleware sees after it.
type outerView struct {
	Status    int
	Size      int64
	Committed bool
	Err       error
	InTx      bool // c.Request() still carries the transaction
}

// setup serves create behind idemecho.Middleware configured by cfg.
func setup(t *testing.T, cfg idempotency.Config, create echo.HandlerFunc) *testBundle {
	t.Helper()
	return setupWith(t, cfg, create, idemecho.Middleware)
}

// setupWith serves create behind the middleware that wrap makes of m.
func setupWith(t *testing.T, cfg idempotency.Config, create echo.HandlerFunc, wrap func(*idempotency.Middleware) echo.MiddlewareFunc) *testBundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	if cfg.Fingerprint.Fields == nil {
		cfg.Fingerprint.Fields = []string{"sku_id", "quantity"}
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &cfg)
	require.NoError(t, err)

	b := &testBundle{db: db}
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			_, inTx := idempotency.TxFromContext(c.Request().Context())
			b.mu.Lock()
			defer b.mu.Unlock()
			b.seen = outerView{Status: c.Response().Status, Size: c.Response().Size, Committed: c.Response().Committed, Err: err, InTx: inTx}
			return err
		}
	})
	inner := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { b.inner.Add(1); return next(c) }
	}
	e.POST("/orders", func(c echo.Context) error { b.creates.Add(1); return create(c) }, wrap(mw), inner)
	b.srv = httptest.NewServer(e)
	t.Cleanup(b.srv.Close)
	return b
}

// createOrder is the protected handler: an order in the request's
// transaction, answered 201 with Location and a JSON body.
func createOrder(delay time.Duration) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req struct {
			SKUID    int64 `json:"sku_id"`
			Quantity int   `json:"quantity"`
		}
		if err := c.Bind(&req); err != nil {
			return err
		}
		order, err := insertOrder(c, req.SKUID, req.Quantity, true)
		if err != nil {
			return err // 500: rolled back, key released
		}
		time.Sleep(delay)
		c.Response().Header().Set("Location", "/orders/"+order.OrderNo)
		return c.JSON(http.StatusCreated, map[string]any{"order_no": order.OrderNo, "sku_id": order.SKUID, "quantity": order.Quantity})
	}
}

// insertOrder writes an order in the request's transaction, with the
// idempotency key when withKey.
func insertOrder(c echo.Context, sku int64, qty int, withKey bool) (*idempotency.Order, error) {
	ctx := c.Request().Context()
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return nil, errors.New("no transaction in c.Request().Context()")
	}
	scope, key, _ := idempotency.KeyFromContext(ctx)
	if !withKey {
		key = ""
	}
	order := &idempotency.Order{OrderNo: "O" + rand.Text(), Scope: scope, IdempotencyKey: key,
		UserID: 1, SKUID: sku, Quantity: qty}
	return order, idempotency.CreateOrder(ctx, tx, order)
}

// insertFailed answers a spec handler's failed insert with a status no spec
// expects.
func insertFailed(err error) error {
	return echo.NewHTTPError(http.StatusTeapot, "insert: "+err.Error())
}

const body = `{"sku_id":20001,"quantity":1}`

// answer is a response read in full, body as raw bytes.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

func (b *testBundle) post(t *testing.T, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

func (a answer) problem(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", a.Header.Get("Content-Type"), "body: %s", a.Body)
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal(a.Body, &p))
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM "+table).Scan(&n))
	return n
}

func (b *testBundle) outer() outerView {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen
}

// requireOuterSaw checks that middleware in front saw the answer sent, the
// original request and no error.
func (b *testBundle) requireOuterSaw(t *testing.T, a answer) {
	t.Helper()
	v := b.outer()
	require.Equal(t, a.Status, v.Status, "the status sent")
	require.EqualValues(t, len(a.Body), v.Size, "the size sent")
	require.True(t, v.Committed)
	require.NoError(t, v.Err, "the answer is the error's answer")
	require.False(t, v.InTx, "c.Request() is the original again")
}

func TestMiddleware_Replay_IsByteIdentical(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, createOrder(0))

	first := b.post(t, "replay-1", body)
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	require.Equal(t, "application/json", first.Header.Get("Content-Type"))
	require.True(t, strings.HasPrefix(first.Header.Get("Location"), "/orders/O"))
	require.Equal(t, strconv.Itoa(len(first.Body)), first.Header.Get("Content-Length"), "one body, written once")
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	b.requireOuterSaw(t, first)

	again := b.post(t, "replay-1", `{"quantity":1,"sku_id":20001}`)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, first.Body, again.Body, "echo's encoder newline included")
	require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	b.requireOuterSaw(t, again)
	require.EqualValues(t, 1, b.creates.Load())
	require.Equal(t, 1, b.count(t, "purchase_order"))
}

func TestMiddleware_OwnAnswer_SkipsHandler(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := setup(t, idempotency.Config{}, func(c echo.Context) error {
		if _, key, _ := idempotency.KeyFromContext(c.Request().Context()); key == "held-1" {
			<-release
		}
		return createOrder(0)(c)
	})
	require.Equal(t, http.StatusCreated, b.post(t, "done-1", body).Status)
	held := make(chan int)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "held-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return b.creates.Load() == 2 }, 5*time.Second, 10*time.Millisecond)

	for _, tc := range []struct {
		rule, key, body string
		status          int
		problem         string
	}{
		{"a replay does not call the handler", "done-1", body, http.StatusCreated, ""},
		{"same key different body is 409 key-reused", "done-1", `{"sku_id":20001,"quantity":2}`, http.StatusConflict, idempotency.ProblemKeyReused},
		{"a key in progress is 409 in-progress", "held-1", body, http.StatusConflict, idempotency.ProblemInProgress},
		{"a missing key is 400", "", body, http.StatusBadRequest, idempotency.ProblemMissingKey},
		{"an invalid key is 400", strings.Repeat("k", 256), body, http.StatusBadRequest, idempotency.ProblemInvalidKey},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			inner, creates := b.inner.Load(), b.creates.Load()
			a := b.post(t, tc.key, tc.body)
			require.Equal(t, tc.status, a.Status, "body: %s", a.Body)
			if tc.problem != "" {
				require.Equal(t, tc.problem, a.problem(t))
			} else {
				require.Equal(t, "true", a.Header.Get("Idempotent-Replayed"))
			}
			if tc.problem == idempotency.ProblemInProgress {
				require.NotEmpty(t, a.Header.Get("Retry-After"))
			}
			require.Equal(t, inner, b.inner.Load(), "nothing inside the middleware ran")
			require.Equal(t, creates, b.creates.Load())
			b.requireOuterSaw(t, a)
		})
	}
	close(release)
	require.Equal(t, http.StatusCreated, <-held)
	require.Equal(t, 2, b.count(t, "purchase_order"))
}

func TestMiddleware_HandlerError_RollsBackAndReleasesKey(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	b := setup(t, idempotency.Config{}, func(c echo.Context) error {
		if failing.Load() {
			if _, err := insertOrder(c, 20001, 1, true); err != nil {
				return insertFailed(err)
			}
			return errors.New("payment gateway down")
		}
		return createOrder(0)(c)
	})

	a := b.post(t, "error-1", body)
	require.Equal(t, http.StatusInternalServerError, a.Status)
	require.JSONEq(t, `{"message":"Internal Server Error"}`, string(a.Body), "echo's answer to the error")
	require.Zero(t, b.count(t, "purchase_order"), "the order is rolled back")
	require.Zero(t, b.count(t, "idempotency_record"), "the key is released")
	b.requireOuterSaw(t, a)

	failing.Store(false)
	retry := b.post(t, "error-1", body)
	require.Equal(t, http.StatusCreated, retry.Status, "body: %s", retry.Body)
	require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "the retry executes")
	require.EqualValues(t, 2, b.creates.Load())
	require.Equal(t, 1, b.count(t, "purchase_order"))
}

func TestMiddleware_HTTPError422_IsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, func(c echo.Context) error {
		if _, err := insertOrder(c, 20001, 1, true); err != nil {
			return insertFailed(err)
		}
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "coupon already used")
	})

	first := b.post(t, "reject-1", body)
	require.Equal(t, http.StatusUnprocessableEntity, first.Status)
	require.JSONEq(t, `{"message":"coupon already used"}`, string(first.Body))
	require.Zero(t, b.count(t, "purchase_order"), "a final 4xx rolls the transaction back")
	b.requireOuterSaw(t, first)

	again := b.post(t, "reject-1", body)
	require.Equal(t, http.StatusUnprocessableEntity, again.Status)
	require.Equal(t, first.Body, again.Body)
	require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, b.creates.Load())
}

func TestMiddleware_Panic_Answers500AndRollsBack(t *testing.T) {
	t.Parallel()
	var panicking atomic.Bool
	panicking.Store(true)
	b := setup(t, idempotency.Config{}, func(c echo.Context) error {
		if panicking.Load() {
			if _, err := insertOrder(c, 20001, 1, true); err != nil {
				return insertFailed(err)
			}
			panic("bug")
		}
		return createOrder(0)(c)
	})

	a := b.post(t, "panic-1", body)
	require.Equal(t, http.StatusInternalServerError, a.Status)
	require.Equal(t, idempotency.ProblemExecutionFailed, a.problem(t))
	b.requireOuterSaw(t, a)
	require.Zero(t, b.count(t, "purchase_order"))
	require.Zero(t, b.count(t, "idempotency_record"), "the key is released")

	panicking.Store(false)
	require.Equal(t, http.StatusCreated, b.post(t, "panic-1", body).Status)
	require.Equal(t, 1, b.count(t, "purchase_order"))
}

// A single-phase route renewing a key past its retention runs it under a
// fenced takeover; a run of the renewal that fails transiently (a 503: the
// database rolled it back) is run again in the same request, so the handler
// runs twice, each run with a response over its own recorder.
func TestMiddleware_SinglePhaseRenewal_RunsTheHandlerAgain(t *testing.T) {
	t.Parallel()
	var failOnce atomic.Bool
	b := setup(t, idempotency.Config{
		Mode: idempotency.ModeSinglePhase, Lease: time.Second, Retention: time.Second, ReplayCacheBytes: -1,
	}, func(c echo.Context) error {
		order, err := insertOrder(c, 20001, 1, false) // the old order keeps the key
		if err != nil {
			return insertFailed(err)
		}
		if failOnce.CompareAndSwap(true, false) {
			return echo.NewHTTPError(http.StatusServiceUnavailable, "rolled back by the database")
		}
		return c.JSON(http.StatusCreated, map[string]string{"order_no": order.OrderNo})
	})

	first := b.post(t, "renew-1", body)
	require.Equal(t, http.StatusCreated, first.Status)
	time.Sleep(1500 * time.Millisecond) // past retention by the database's clock
	failOnce.Store(true)

	renewed := b.post(t, "renew-1", body)
	require.Equal(t, http.StatusCreated, renewed.Status, "body: %s", renewed.Body)
	require.NotEqual(t, first.Body, renewed.Body, "a renewed key executes anew")
	require.EqualValues(t, 3, b.creates.Load(), "the renewal ran the handler twice")
	require.EqualValues(t, 3, b.inner.Load())
	b.requireOuterSaw(t, renewed)
	require.Equal(t, 2, b.count(t, "purchase_order"), "the first order and the renewal's; the rolled-back run left nothing")

	again := b.post(t, "renew-1", body)
	require.Equal(t, renewed.Body, again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
}

func TestMiddleware_KeyOptional_PassesKeylessRequestsThroughUnrecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{KeyOptional: true}, func(c echo.Context) error {
		_, inTx := idempotency.TxFromContext(c.Request().Context())
		return c.JSON(http.StatusAccepted, map[string]bool{"in_tx": inTx})
	})
	a := b.post(t, "", body)
	require.Equal(t, http.StatusAccepted, a.Status)
	require.JSONEq(t, `{"in_tx":false}`, string(a.Body))
	b.requireOuterSaw(t, a)
	require.Zero(t, b.count(t, "idempotency_record"))
}

// Why this package exists: echo.WrapMiddleware hands the handler's error to
// echo after the middleware has finished, so the middleware recorded
// nothing and committed the handler's writes with an empty 200 as the
// stored answer; echo's error answer goes to a response nobody sends.
func TestWrapMiddleware_HandlerError_IsCommittedAsEmpty200(t *testing.T) {
	t.Parallel()
	b := setupWith(t, idempotency.Config{}, func(c echo.Context) error {
		if _, err := insertOrder(c, 20001, 1, true); err != nil {
			return insertFailed(err)
		}
		return errors.New("payment gateway down")
	}, func(m *idempotency.Middleware) echo.MiddlewareFunc { return echo.WrapMiddleware(m.Handler) })

	a := b.post(t, "wrap-1", body)
	require.Equal(t, http.StatusOK, a.Status, "the client never hears of the error")
	require.Empty(t, a.Body)
	require.Equal(t, 1, b.count(t, "purchase_order"), "the failed handler's order committed")
	replay := b.post(t, "wrap-1", body)
	require.Equal(t, http.StatusOK, replay.Status, "and the empty 200 is replayed")
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
}
