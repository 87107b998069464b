package main

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/history"
)

// historyRequest is c as the history names it: its key as the orders table
// does (scope, the user, and the idempotency key) and its body, which the
// server fingerprints.
func (c crashCreate) historyRequest() history.Request {
	return history.Request{Key: strconv.FormatInt(c.user, 10) + "/" + c.key, Fingerprint: string(c.body)}
}

// historyResponse is a as the history records it: no answer (a server
// killed mid-request) is an unknown outcome.
func (a crashAnswer) historyResponse() history.Response {
	if a.err != nil {
		return history.Failed(a.err)
	}
	return history.Answer(a.status, a.header, a.body)
}

// checkCrashHistory checks every request the spec's clients sent, across
// the kills and restarts, against the HTTP contract's model and the orders
// in db (internal/history, with porcupine).
func checkCrashHistory(t *testing.T, db *sql.DB, hist *history.Recorder) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orders, err := history.ReadOrders(ctx, db, "SELECT CONCAT(scope, '/', idempotency_key), order_no FROM purchase_order")
	require.NoError(t, err)
	history.Check(t, hist, orders, history.Config{OrderOf: history.JSONField("order_no")})
}
