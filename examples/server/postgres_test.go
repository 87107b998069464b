package main

// The example server on PostgreSQL, as a user runs it: the real binary with
// -db postgres://… on a fresh schema (search_path in the URL), docs/getting-started.md's
// walkthrough, the reconciler's backfill, and the crash tests of
// crash_test.go.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// crashPostgres is a fresh PostgreSQL schema; the -db URL is the pgx
// connection string whose search_path names it.
func crashPostgres(t *testing.T) (*sql.DB, string) {
	t.Helper()
	return pgtest.Postgres(t)
}

func TestPostgres_CrashAtEveryPoint_RetryAfterRestartCreatesOneOrderWithinLeasePlusReconcileAndReplaysItByteForByte(t *testing.T) {
	testCrashAtEveryPoint(t, crashPostgres)
}

func TestPostgres_RandomKill9_NoDuplicateNoLostAcknowledgedOrderAndEveryKeyAnswered(t *testing.T) {
	testRandomKill9(t, crashPostgres)
}

// walkthroughCall is one of the walkthrough's (docs/getting-started.md) curl commands.
type walkthroughCall struct {
	method, path, user, key, body string
}

func (c walkthroughCall) do(t *testing.T, client *http.Client, base string) crashAnswer {
	t.Helper()
	a := exchange(client, c.request(t, base))
	require.NoError(t, a.err)
	return a
}

func (c walkthroughCall) request(t *testing.T, base string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
	require.NoError(t, err)
	req.Header.Set("X-User-ID", c.user)
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// exchange sends req and reads the whole answer.
func exchange(client *http.Client, req *http.Request) crashAnswer {
	resp, err := client.Do(req)
	if err != nil {
		return crashAnswer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return crashAnswer{err: err}
	}
	return crashAnswer{status: resp.StatusCode, header: resp.Header, body: body}
}

// TestPostgres_ReadmeWalkthrough_AnswersAsOnSQLiteAndMySQL runs docs/getting-started.md's
// walkthrough against go run ./examples/server -db postgres://… and checks
// the answers it prints: status, headers and bodies (order numbers are
// random).
func TestPostgres_ReadmeWalkthrough_AnswersAsOnSQLiteAndMySQL(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.Postgres(t)
	// The server's defaults (-lease 30s, -reconcile-interval 5s), as the
	// walkthrough runs it.
	srv := newCrashServer(t, dbURL, "claim-first", "-lease", "30s", "-reconcile-interval", "5s")
	srv.start("")
	client := &http.Client{Timeout: 10 * time.Second}
	base := "http://" + srv.addr

	// Create.
	create := walkthroughCall{method: http.MethodPost, path: "/orders", user: "1001", key: "run-7f3a91c4/call-1",
		body: `{"user_id":1001,"sku_id":20087,"quantity":1,"coupon_id":99}`}
	first := create.do(t, client, base)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	orderNo := first.orderNo(t)
	require.Regexp(t, `^O\d{8}[0-9a-f]{16}$`, orderNo)
	wantBody := fmt.Sprintf(`{"order_no":"%s","status":"CREATED","user_id":1001,"sku_id":20087,"quantity":1,"coupon_id":99,"unit_price_cents":3150,"discount_cents":500,"total_cents":2650}`+"\n", orderNo)
	require.Equal(t, wantBody, string(first.body))
	require.Equal(t, "182", first.header.Get("Content-Length"))
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	require.Equal(t, "/orders/"+orderNo, first.header.Get("Location"))
	require.Empty(t, first.header.Get("Idempotent-Replayed"))

	// The agent retries: fields reordered, a new trace_id. Same order, replayed.
	retry := create
	retry.body = `{"sku_id":20087,"user_id":1001,"quantity":1,"coupon_id":99,"trace_id":"retry-2"}`
	replay := retry.do(t, client, base)
	require.Equal(t, http.StatusCreated, replay.status, "%s", replay.body)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, "/orders/"+orderNo, replay.header.Get("Location"))
	require.Equal(t, wantBody, string(replay.body))

	// The agent changes the coupon under the same key: refused, nothing written.
	changed := create
	changed.body = `{"user_id":1001,"sku_id":20087,"quantity":1,"coupon_id":100}`
	conflict := changed.do(t, client, base)
	require.Equal(t, http.StatusConflict, conflict.status)
	require.Equal(t, "no-store", conflict.header.Get("Cache-Control"))
	require.Equal(t, "application/problem+json", conflict.header.Get("Content-Type"))
	require.Equal(t, `{"type":"urn:orderguard:problem:key-reused","title":"Idempotency key reused","status":409,"detail":"This key was already used with a different request. Use a new key for a new action."}`,
		string(conflict.body))
	require.Equal(t, "185", conflict.header.Get("Content-Length"))
	var coupon100 string
	require.NoError(t, db.QueryRow(`SELECT status FROM coupon WHERE id = 100`).Scan(&coupon100))
	require.Equal(t, "AVAILABLE", coupon100, "the refused request wrote nothing")

	// Business rejections are final and replayed too.
	unknown := walkthroughCall{method: http.MethodPost, path: "/orders", user: "1001", key: "run-7f3a91c4/call-2",
		body: `{"user_id":1001,"sku_id":99999,"quantity":1}`}
	for i := range 2 {
		a := unknown.do(t, client, base)
		require.Equal(t, http.StatusUnprocessableEntity, a.status)
		require.Equal(t, `{"type":"urn:orderguard:problem:unknown-sku","title":"Unknown SKU","status":422,"detail":"sku_id 99999 is not in the catalog"}`,
			string(a.body), "answer %d", i+1)
		require.Equal(t, "126", a.header.Get("Content-Length"))
	}

	// The order reads back with its payment state, pays once, and a
	// cancel once paid cancels it owing the refund.
	get := walkthroughCall{method: http.MethodGet, path: "/orders/" + orderNo, user: "1001"}
	a := get.do(t, client, base)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, strings.TrimSuffix(wantBody, "}\n")+`,"currency":"CNY","refunded_cents":0}`+"\n", string(a.body))
	a = (walkthroughCall{method: http.MethodGet, path: "/orders/" + orderNo, user: "1002"}).do(t, client, base)
	require.Equal(t, http.StatusNotFound, a.status, "another user's order")
	pay := walkthroughCall{method: http.MethodPost, path: "/orders/" + orderNo + "/pay", user: "1001", key: "pay-1", body: `{}`}
	a = pay.do(t, client, base)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Contains(t, string(a.body), `"status":"PAID"`)
	// The cancel is the payment state machine's cancel request
	// (Orders.RequestCancel): a PAID order is CANCELED and owes its refund,
	// as when the cancel arrives before the payment's callback. It used to
	// be 409 invalid-transition here, which made the order's end depend on
	// which of the two arrived first.
	a = (walkthroughCall{method: http.MethodPost, path: "/orders/" + orderNo + "/cancel", user: "1001", key: "cancel-1", body: `{}`}).do(t, client, base)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Contains(t, string(a.body), `"status":"CANCELED"`)
	a = (walkthroughCall{method: http.MethodPost, path: "/orders/" + orderNo + "/cancel", user: "1001", key: "cancel-2", body: `{}`}).do(t, client, base)
	require.Equal(t, http.StatusConflict, a.status, "a second cancel under a new key")
	require.Equal(t, "invalid-transition", a.problemKind())
	require.Contains(t, string(a.body), "is CANCELED; only a CREATED or PAID order can be canceled")

	var orders int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&orders))
	require.Equal(t, 1, orders)
}

// The walkthrough's incident on PostgreSQL: a slow order, a client that gives up,
// an immediate retry told the first attempt is still running (as on MySQL:
// PostgreSQL has row locks, not one writer), and the next retry replaying
// the order the first attempt committed after its client left.
func TestPostgres_ReadmeIncident_RetryDuringASlowOrderIsInProgressThenReplaysIt(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.Postgres(t)
	const delay = 1500 * time.Millisecond
	srv := newCrashServer(t, dbURL, "claim-first", "-lease", "30s", "-reconcile-interval", "5s", "-handler-delay", delay.String())
	srv.start("")
	base := "http://" + srv.addr
	call := walkthroughCall{method: http.MethodPost, path: "/orders", user: "1001", key: "run-7f3a91c4/call-3",
		body: `{"user_id":1001,"sku_id":20001,"quantity":1}`}

	gaveUp := exchange(&http.Client{Timeout: delay / 3}, call.request(t, base))
	require.Error(t, gaveUp.err, "the client gives up before the order commits")

	a := call.do(t, &http.Client{Timeout: 10 * time.Second}, base)
	require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
	require.Equal(t, idempotency.ProblemInProgress, a.problemKind())
	require.Equal(t, "1", a.header.Get("Retry-After"))

	require.Eventually(t, func() bool {
		a = call.do(t, &http.Client{Timeout: 10 * time.Second}, base)
		return a.status == http.StatusCreated
	}, 3*delay, 100*time.Millisecond, "the first attempt commits after its client left")
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
	orderNo := a.orderNo(t)
	require.Equal(t, fmt.Sprintf(`{"order_no":"%s","status":"CREATED","user_id":1001,"sku_id":20001,"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000}`+"\n", orderNo),
		string(a.body))
	var orders int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM purchase_order`).Scan(&orders))
	require.Equal(t, 1, orders)
}

// TestPostgres_ReconcilerBackfill_RecoversTheCommittedOrder: the running
// server's reconciler finishes an abandoned claim whose order committed
// (orderservice's Recover on PostgreSQL: the order's created_at against the
// record's, both by clock_timestamp()), and a retry replays that order.
func TestPostgres_ReconcilerBackfill_RecoversTheCommittedOrder(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.Postgres(t)
	s := newCrashServer(t, dbURL, "claim-first", "-retention", "1h")
	s.start("") // it migrates and seeds the schema

	ctx := context.Background()
	store := postgres.NewStore(db)
	_, err := store.Claim(ctx, idempotency.Claim{Scope: "7", Key: "abandoned", Fingerprint: "fp", Owner: "crashed/1",
		Lease: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, idempotency.PostgresOrders.Create(ctx, tx, &idempotency.Order{
		OrderNo: "O-ABANDONED", Scope: "7", IdempotencyKey: "abandoned", UserID: 7, SKUID: 20001, Quantity: 1,
		UnitPriceCents: 1000, TotalCents: 1000,
	}))
	require.NoError(t, tx.Commit())
	_, err = db.Exec(`UPDATE idempotency_record SET locked_until = clock_timestamp() - interval '1 second' WHERE idempotency_key = 'abandoned'`)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		rec, err := store.Lookup(ctx, "7", "abandoned")
		return err == nil && rec.Status == idempotency.StatusDone
	}, 10*crashTestReconcile+5*time.Second, 50*time.Millisecond, "the reconciler finishes the record")
	rec, err := store.Lookup(ctx, "7", "abandoned")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, rec.Snapshot.StatusCode)
	require.Equal(t, "/orders/O-ABANDONED", rec.Snapshot.Header.Get("Location"))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Snapshot.Body, &body))
	require.Equal(t, "O-ABANDONED", body["order_no"])
	require.Equal(t, "CREATED", body["status"])

	var lives float64
	require.NoError(t, db.QueryRow(`SELECT extract(epoch FROM expires_at - updated_at) FROM idempotency_record
WHERE idempotency_key = 'abandoned'`).Scan(&lives))
	require.InDelta(t, time.Hour.Seconds(), lives, 0.001, "seconds from the backfill to the record's expiry")
}
