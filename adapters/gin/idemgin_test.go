package idemgin_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	idemgin "github.com/orderguard/idempotency/adapters/gin"
	"github.com/orderguard/idempotency/internal/testdb"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

// constructor builds a route's handlers around the protected ones: the two
// ways to register the middleware, which every spec that holds for both runs
// through.
type constructor struct {
	name  string
	route func(mw *idempotency.Middleware, protected ...gin.HandlerFunc) []gin.HandlerFunc
}

var (
	wrap = constructor{"Wrap", func(mw *idempotency.Middleware, protected ...gin.HandlerFunc) []gin.HandlerFunc {
		return []gin.HandlerFunc{idemgin.Wrap(mw, protected...)}
	}}
	chain = constructor{"Middleware", func(mw *idempotency.Middleware, protected ...gin.HandlerFunc) []gin.HandlerFunc {
		return append([]gin.HandlerFunc{idemgin.Middleware(mw)}, protected...)
	}}
	constructors = []constructor{wrap, chain}
)

// forEachConstructor runs spec once per constructor, in parallel.
func forEachConstructor(t *testing.T, spec func(t *testing.T, ctor constructor)) {
	t.Helper()
	t.Parallel()
	for _, ctor := range constructors {
		t.Run(ctor.name, func(t *testing.T) {
			t.Parallel()
			spec(t, ctor)
		})
	}
}

// testBundle is a real gin engine on loopback over a fresh MariaDB database,
// one route built by a constructor:
//
//	outer → idemgin.Wrap(mw, inner, …, create) → after
//	outer → idemgin.Middleware(mw) → inner → … → create → after
//
// outer records what the middleware left behind; the counters say which
// handlers ran.
type testBundle struct {
	db  *sql.DB
	srv *httptest.Server

	inner, creates, after atomic.Int32

	mu          sync.Mutex
	outerAbort  bool // c.IsAborted() in outer after the last request
	outerStatus int  // c.Writer.Status() in outer after the last request
	outerSize   int  // c.Writer.Size() in outer after the last request
	outerErrors int  // len(c.Errors) in outer after the last request
	outerInTx   bool // c.Request.Context() carried a transaction in outer
}

// setup serves protected behind the middleware configured by cfg, built by
// ctor. The last protected handler is create: b.creates counts its calls.
func setup(t *testing.T, ctor constructor, cfg idempotency.Config, protected ...gin.HandlerFunc) *testBundle {
	t.Helper()
	return setupWithFront(t, ctor, cfg, nil, protected...)
}

// setupWithFront is setup with front registered in front of the middleware,
// after outer.
func setupWithFront(t *testing.T, ctor constructor, cfg idempotency.Config, front []gin.HandlerFunc, protected ...gin.HandlerFunc) *testBundle {
	t.Helper()
	db, _ := testdb.MySQL(t)
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	if cfg.Fingerprint.Fields == nil {
		cfg.Fingerprint.Fields = []string{"sku_id", "quantity"}
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &cfg)
	require.NoError(t, err)

	b := &testBundle{db: db}
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		b.mu.Lock()
		defer b.mu.Unlock()
		b.outerAbort, b.outerStatus, b.outerSize = c.IsAborted(), c.Writer.Status(), c.Writer.Size()
		b.outerErrors = len(c.Errors)
		_, b.outerInTx = idempotency.TxFromContext(c.Request.Context())
	})
	r.Use(front...)
	create := protected[len(protected)-1]
	handlers := append([]gin.HandlerFunc{func(c *gin.Context) { b.inner.Add(1) }}, protected[:len(protected)-1]...)
	handlers = append(handlers, func(c *gin.Context) { b.creates.Add(1); create(c) })
	r.POST("/orders", append(ctor.route(mw, handlers...), func(c *gin.Context) { b.after.Add(1) })...)
	b.srv = httptest.NewServer(r)
	t.Cleanup(b.srv.Close)
	return b
}

// createOrder is the protected handler: an order in the request's
// transaction, answered 201 with Location and a JSON body.
func createOrder(delay time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		var req struct {
			SKUID    int64 `json:"sku_id"`
			Quantity int   `json:"quantity"`
		}
		if err := c.ShouldBindJSON(&req); err != nil {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		order, err := insertOrder(c, req.SKUID, req.Quantity, true)
		if err != nil {
			c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		time.Sleep(delay)
		c.Header("Location", "/orders/"+order.OrderNo)
		c.JSON(http.StatusCreated, gin.H{"order_no": order.OrderNo, "sku_id": order.SKUID, "quantity": order.Quantity})
	}
}

// insertOrder writes an order in the request's transaction, with the
// idempotency key when withKey.
func insertOrder(c *gin.Context, sku int64, qty int, withKey bool) (*idempotency.Order, error) {
	ctx := c.Request.Context()
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return nil, errors.New("no transaction in c.Request.Context()")
	}
	scope, key, _ := idempotency.KeyFromContext(ctx)
	if !withKey {
		key = ""
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	order := &idempotency.Order{OrderNo: "O" + hex.EncodeToString(b[:]), Scope: scope, IdempotencyKey: key,
		UserID: 1, SKUID: sku, Quantity: qty}
	return order, idempotency.CreateOrder(ctx, tx, order)
}

// insertFailed answers a spec handler's failed insert with a status no spec
// expects.
func insertFailed(c *gin.Context, err error) {
	c.AbortWithStatusJSON(http.StatusTeapot, gin.H{"insert": err.Error()})
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

// outer returns what the middleware in front of idemgin saw after the last
// request.
func (b *testBundle) outer() (aborted bool, status, size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outerAbort, b.outerStatus, b.outerSize
}

func TestReplay_IsByteIdentical(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		b := setup(t, ctor, idempotency.Config{}, createOrder(0))

		first := b.post(t, "replay-1", body)
		require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
		require.Equal(t, "application/json; charset=utf-8", first.Header.Get("Content-Type"), "c.JSON's Content-Type, set after the status, is recorded")
		require.True(t, strings.HasPrefix(first.Header.Get("Location"), "/orders/O"))
		require.Empty(t, first.Header.Get("Idempotent-Replayed"))

		again := b.post(t, "replay-1", `{"quantity":1,"sku_id":20001}`)
		require.Equal(t, http.StatusCreated, again.Status)
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
		require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		require.EqualValues(t, 1, b.creates.Load())
		require.Equal(t, 1, b.count(t, "purchase_order"))
	})
}

func TestHandlersAnswer_IsSentOnceAndNotAborted(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		b := setup(t, ctor, idempotency.Config{}, createOrder(0))

		a := b.post(t, "chain-1", body)
		require.Equal(t, http.StatusCreated, a.Status)
		require.Equal(t, a.Header.Get("Content-Length"), strconv.Itoa(len(a.Body)), "one body, written once")
		aborted, status, size := b.outer()
		require.False(t, aborted)
		require.Equal(t, http.StatusCreated, status, "middleware in front sees the status sent")
		require.Equal(t, len(a.Body), size, "and the size sent")
		b.mu.Lock()
		require.False(t, b.outerInTx, "c.Request is restored")
		b.mu.Unlock()
		require.EqualValues(t, 1, b.inner.Load())
		require.EqualValues(t, 1, b.after.Load(), "handlers after a non-aborting handler run")
	})
}

func TestOwnAnswer_AbortsTheRoute(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		release := make(chan struct{})
		b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
			if _, key, _ := idempotency.KeyFromContext(c.Request.Context()); key == "held-1" {
				<-release
			}
			createOrder(0)(c)
		})
		require.Equal(t, http.StatusCreated, b.post(t, "done-1", body).Status)
		held := make(chan answer)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/orders", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "held-1")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				held <- answer{Status: resp.StatusCode}
				return
			}
			held <- answer{}
		}()
		require.Eventually(t, func() bool { return b.creates.Load() == 2 }, 5*time.Second, 10*time.Millisecond)

		for _, tc := range []struct {
			rule, key, body string
			status          int
			problem         string
		}{
			{"a replay does not run the handlers", "done-1", body, http.StatusCreated, ""},
			{"same key different body is 409 key-reused", "done-1", `{"sku_id":20001,"quantity":2}`, http.StatusConflict, idempotency.ProblemKeyReused},
			{"a key in progress is 409 in-progress", "held-1", body, http.StatusConflict, idempotency.ProblemInProgress},
			{"a missing key is 400", "", body, http.StatusBadRequest, idempotency.ProblemMissingKey},
			{"an invalid key is 400", strings.Repeat("k", 256), body, http.StatusBadRequest, idempotency.ProblemInvalidKey},
		} {
			t.Run(tc.rule, func(t *testing.T) {
				inner, creates, after := b.inner.Load(), b.creates.Load(), b.after.Load()
				a := b.post(t, tc.key, tc.body)
				require.Equal(t, tc.status, a.Status, "body: %s", a.Body)
				if tc.problem != "" {
					require.Equal(t, tc.problem, a.problem(t))
				} else {
					require.Equal(t, "true", a.Header.Get("Idempotent-Replayed"))
				}
				require.Equal(t, inner, b.inner.Load(), "no protected handler ran")
				require.Equal(t, creates, b.creates.Load())
				require.Equal(t, after, b.after.Load(), "nor a handler after them")
				aborted, status, size := b.outer()
				require.True(t, aborted, "c.IsAborted() after the middleware answered")
				require.Equal(t, tc.status, status)
				require.Equal(t, len(a.Body), size)
			})
		}
		close(release)
		require.Equal(t, http.StatusCreated, (<-held).Status)
		require.Equal(t, 2, b.count(t, "purchase_order"))
	})
}

func TestAbortingHandler_StopsTheHandlersAfterIt(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		guard := func(c *gin.Context) {
			c.AbortWithStatusJSON(http.StatusForbidden, gin.H{"error": "not your cart"})
		}
		b := setup(t, ctor, idempotency.Config{}, guard, createOrder(0))

		a := b.post(t, "guard-1", body)
		require.Equal(t, http.StatusForbidden, a.Status)
		require.JSONEq(t, `{"error":"not your cart"}`, string(a.Body))
		require.EqualValues(t, 1, b.inner.Load(), "the handlers before the abort ran")
		require.Zero(t, b.creates.Load(), "the protected handlers after it did not")
		require.Zero(t, b.after.Load(), "nor the route's")
		aborted, status, _ := b.outer()
		require.True(t, aborted)
		require.Equal(t, http.StatusForbidden, status)
		require.Zero(t, b.count(t, "purchase_order"))

		again := b.post(t, "guard-1", body)
		require.Equal(t, http.StatusForbidden, again.Status, "a final 403 is stored and replayed")
		require.Equal(t, a.Body, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	})
}

func TestAbortWithStatusJSON422_IsStoredAndReplayed(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
			if _, err := insertOrder(c, 20001, 1, true); err != nil {
				insertFailed(c, err)
				return
			}
			c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"error": "coupon already used"})
		})

		first := b.post(t, "reject-1", body)
		require.Equal(t, http.StatusUnprocessableEntity, first.Status)
		require.JSONEq(t, `{"error":"coupon already used"}`, string(first.Body))
		aborted, _, _ := b.outer()
		require.True(t, aborted, "the handler's own abort is kept")
		require.Zero(t, b.after.Load(), "handlers after an aborting handler do not run")
		require.Zero(t, b.count(t, "purchase_order"), "a final 4xx rolls the transaction back")

		again := b.post(t, "reject-1", body)
		require.Equal(t, http.StatusUnprocessableEntity, again.Status)
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		require.EqualValues(t, 1, b.creates.Load())
	})
}

func TestStatusThenHeaders_AreRecordedAsGinSendsThem(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		for _, tc := range []struct {
			rule   string
			handle func(c *gin.Context, location string)
			body   string
		}{
			{"a bodiless c.Status(201) is recorded as 201", func(c *gin.Context, location string) {
				c.Status(http.StatusCreated)
				c.Header("Location", location)
			}, ""},
			{"headers set after c.Status and before the body are recorded", func(c *gin.Context, location string) {
				c.Status(http.StatusCreated)
				c.Header("Location", location)
				c.Header("Content-Type", "text/plain")
				_, _ = c.Writer.WriteString("created")
			}, "created"},
		} {
			t.Run(tc.rule, func(t *testing.T) {
				t.Parallel()
				b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
					order, err := insertOrder(c, 20001, 1, true)
					if err != nil {
						insertFailed(c, err)
						return
					}
					tc.handle(c, "/orders/"+order.OrderNo)
				})
				first := b.post(t, "status-1", body)
				again := b.post(t, "status-1", body)
				for _, a := range []answer{first, again} {
					require.Equal(t, http.StatusCreated, a.Status)
					require.Equal(t, tc.body, string(a.Body))
					require.NotEmpty(t, a.Header.Get("Location"))
				}
				require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
				require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
				require.Equal(t, 1, b.count(t, "purchase_order"))
			})
		}
	})
}

func TestHandlerError_RollsBackAndReleasesKey(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		var failing atomic.Bool
		failing.Store(true)
		b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
			if failing.Load() {
				if _, err := insertOrder(c, 20001, 1, true); err != nil {
					insertFailed(c, err)
					return
				}
				_ = c.AbortWithError(http.StatusInternalServerError, errors.New("payment gateway down"))
				return
			}
			createOrder(0)(c)
		})

		a := b.post(t, "error-1", body)
		require.Equal(t, http.StatusInternalServerError, a.Status)
		require.Zero(t, b.count(t, "purchase_order"), "the order is rolled back with the answer")
		require.Zero(t, b.count(t, "idempotency_record"), "the key is released")

		failing.Store(false)
		retry := b.post(t, "error-1", body)
		require.Equal(t, http.StatusCreated, retry.Status, "body: %s", retry.Body)
		require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "the retry executes")
		require.EqualValues(t, 2, b.creates.Load())
		require.Equal(t, 1, b.count(t, "purchase_order"))
	})
}

func TestPanic_Answers500AndAbortsTheRoute(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		var panicking atomic.Bool
		panicking.Store(true)
		b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
			if panicking.Load() {
				if _, err := insertOrder(c, 20001, 1, true); err != nil {
					insertFailed(c, err)
					return
				}
				panic("bug")
			}
			createOrder(0)(c)
		})

		a := b.post(t, "panic-1", body)
		require.Equal(t, http.StatusInternalServerError, a.Status)
		require.Equal(t, idempotency.ProblemExecutionFailed, a.problem(t))
		aborted, status, _ := b.outer()
		require.True(t, aborted, "gin does not go on after the panicking handler")
		require.Equal(t, http.StatusInternalServerError, status)
		require.Zero(t, b.after.Load())
		require.Zero(t, b.count(t, "purchase_order"))
		require.Zero(t, b.count(t, "idempotency_record"), "the key is released")

		panicking.Store(false)
		require.Equal(t, http.StatusCreated, b.post(t, "panic-1", body).Status)
		require.Equal(t, 1, b.count(t, "purchase_order"))
	})
}

// gin lets a handler report errors with c.Error and leave the answer to an
// error renderer in front of it. In front of the middleware that answer
// would come after the commit: the handlers' empty 200 would be committed
// and replayed. Such handlers are answered 500 instead.
func TestErrorsWithoutAnswer_RollBackAs500(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		var failing atomic.Bool
		failing.Store(true)
		b := setup(t, ctor, idempotency.Config{}, func(c *gin.Context) {
			if failing.Load() {
				if _, err := insertOrder(c, 20001, 1, true); err != nil {
					insertFailed(c, err)
					return
				}
				_ = c.Error(errors.New("payment gateway down"))
				return
			}
			createOrder(0)(c)
		})

		a := b.post(t, "errors-1", body)
		require.Equal(t, http.StatusInternalServerError, a.Status)
		aborted, status, _ := b.outer()
		require.True(t, aborted)
		require.Equal(t, http.StatusInternalServerError, status)
		require.Zero(t, b.count(t, "purchase_order"), "the order is rolled back")
		require.Zero(t, b.count(t, "idempotency_record"), "the key is released")

		failing.Store(false)
		require.Equal(t, http.StatusCreated, b.post(t, "errors-1", body).Status)
		require.Equal(t, 1, b.count(t, "purchase_order"))
	})
}

// A bodiless c.Status(201) is not written until gin's chain ends, so
// handlers that set it and then add to c.Errors leave the answer to the
// renderer in front as much as handlers that set nothing: gin with the
// renderer answers the errors and the application rolls back. Neither may
// the middleware commit the 201.
func TestErrorsAfterABodilessStatus_RollBackAs500(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		b := setupWithFront(t, ctor, idempotency.Config{}, []gin.HandlerFunc{renderErrors}, func(c *gin.Context) {
			if _, err := insertOrder(c, 20001, 1, true); err != nil {
				insertFailed(c, err)
				return
			}
			c.Status(http.StatusCreated)
			_ = c.Error(errors.New("coupon already used"))
			c.Abort()
		})

		a := b.post(t, "bodiless-1", body)
		require.Equal(t, http.StatusInternalServerError, a.Status, "body: %s", a.Body)
		require.Zero(t, b.count(t, "purchase_order"), "an order for a request the renderer refuses")
		require.Zero(t, b.count(t, "idempotency_record"), "the key is released")
	})
}

func TestKeyOptional_PassesKeylessRequestsThroughUnrecorded(t *testing.T) {
	forEachConstructor(t, func(t *testing.T, ctor constructor) {
		b := setup(t, ctor, idempotency.Config{KeyOptional: true}, func(c *gin.Context) {
			_, inTx := idempotency.TxFromContext(c.Request.Context())
			c.JSON(http.StatusAccepted, gin.H{"in_tx": inTx})
		})
		a := b.post(t, "", body)
		require.Equal(t, http.StatusAccepted, a.Status)
		require.JSONEq(t, `{"in_tx":false}`, string(a.Body))
		aborted, status, _ := b.outer()
		require.False(t, aborted)
		require.Equal(t, http.StatusAccepted, status)
		require.EqualValues(t, 1, b.after.Load())
		require.Zero(t, b.count(t, "idempotency_record"))
	})
}

// singlePhaseRenewal is a single-phase route without the replay cache, so
// that a request for a key whose record is past its retention (b.expire)
// meets the record and renews the key under a fenced takeover; a run of
// that renewal that fails transiently (a 503: the database rolled it back)
// is run again in the same request, so the handlers run twice.
var singlePhaseRenewal = idempotency.Config{Mode: idempotency.ModeSinglePhase, ReplayCacheBytes: -1}

// expire puts every record past its retention by the database's clock, as
// time would.
func (b *testBundle) expire(t *testing.T) {
	t.Helper()
	_, err := b.db.Exec("UPDATE idempotency_record SET expires_at = NOW(6) - INTERVAL 1 SECOND")
	require.NoError(t, err)
}

func TestWrap_SinglePhaseRenewal_RunsTheHandlersAgain(t *testing.T) {
	t.Parallel()
	var failOnce atomic.Bool
	b := setup(t, wrap, singlePhaseRenewal, func(c *gin.Context) {
		_ = c.Error(errors.New("noted by this run"))
		order, err := insertOrder(c, 20001, 1, false) // the old order keeps the key
		if err != nil {
			insertFailed(c, err)
			return
		}
		if failOnce.CompareAndSwap(true, false) {
			c.JSON(http.StatusServiceUnavailable, gin.H{"error": "rolled back by the database"})
			return
		}
		c.JSON(http.StatusCreated, gin.H{"order_no": order.OrderNo})
	})

	first := b.post(t, "renew-1", body)
	require.Equal(t, http.StatusCreated, first.Status)
	b.expire(t)
	failOnce.Store(true)

	renewed := b.post(t, "renew-1", body)
	require.Equal(t, http.StatusCreated, renewed.Status, "body: %s", renewed.Body)
	require.NotEqual(t, first.Body, renewed.Body, "a renewed key executes anew")
	require.Empty(t, renewed.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 3, b.creates.Load(), "the renewal ran the handlers twice")
	require.EqualValues(t, 3, b.inner.Load(), "from the first")
	require.EqualValues(t, 2, b.after.Load(), "the route's handlers after Wrap run once per request")
	aborted, status, size := b.outer()
	require.False(t, aborted)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, len(renewed.Body), size)
	require.Equal(t, 2, b.count(t, "purchase_order"), "the first order and the renewal's; the rolled-back run left nothing")
	b.mu.Lock()
	require.Equal(t, 1, b.outerErrors, "c.Errors of the rolled-back run are dropped")
	b.mu.Unlock()

	again := b.post(t, "renew-1", body)
	require.Equal(t, renewed.Body, again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
}

func TestMiddleware_SinglePhaseRoute_IsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), &idempotency.Config{Mode: idempotency.ModeSinglePhase})
	require.NoError(t, err)
	require.PanicsWithValue(t,
		"idemgin: Middleware runs gin's chain once; a single-phase route may run its handler again: use idemgin.Wrap",
		func() { idemgin.Middleware(mw) })
	require.NotPanics(t, func() { idemgin.Wrap(mw, func(*gin.Context) {}) }, "Wrap runs single-phase routes")
}

func TestWrap_WithoutHandlers_IsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), nil)
	require.NoError(t, err)
	require.PanicsWithValue(t, "idemgin: Wrap needs the handlers it protects", func() { idemgin.Wrap(mw) })
}
