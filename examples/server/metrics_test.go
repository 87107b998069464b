package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
)

func TestServer_MetricsEndpoint_CountsCreatesReplaysAndConflicts(t *testing.T) {
	t.Parallel()
	_, dsn := testdb.MySQL(t)
	s := newCrashServer(t, "mysql://"+dsn, "claim-first")
	s.start("")
	client := &http.Client{}

	create := newCrashCreate(5, "metrics-key")
	require.Equal(t, http.StatusCreated, create.send(client, s.url("/orders")).status)
	require.Equal(t, http.StatusCreated, create.send(client, s.url("/orders")).status)
	changed := create
	changed.body = []byte(`{"user_id":5,"sku_id":20001,"quantity":99}`)
	require.Equal(t, http.StatusConflict, changed.send(client, s.url("/orders")).status)

	resp, err := client.Get(s.url("/metrics"))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	text := string(body)
	for _, line := range []string{
		`idempotency_requests_total{outcome="committed",route="create_order"} 1`,
		`idempotency_requests_total{outcome="replayed",route="create_order"} 1`,
		`idempotency_requests_total{outcome="conflict",route="create_order"} 1`,
		`idempotency_events_total{event="claimed",route="create_order"} 1`,
		`idempotency_claims_in_flight{route="create_order"} 0`,
	} {
		require.Contains(t, text, line+"\n")
	}
	require.NotContains(t, text, "metrics-key", "keys never appear in metrics")
	require.True(t, strings.Contains(text, "go_goroutines"), "runtime metrics are served too")
}
