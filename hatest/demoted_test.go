package hatest_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/logcount"
	"github.com/orderguard/idempotency/postgres"
)

// TestMultiHostURL_EveryNodeAStandby_Answers503WithRetryAfter: the moment
// of a switchover, or of a leader that lost etcd and demoted itself, when
// every node a multi-host URL lists answers and none takes writes: pgx's
// target_session_attrs=read-write refuses each ("read only connection").
// It is the gap of a failover without a dead node, and the service answers
// it as one: 503 with Retry-After, never 500. The URL lists the two
// standbys only, which freezes that moment. (The read answered 500 until
// the postgres module's pools classified pgx's read-only refusal as
// transient: postgres/transient.go.)
func TestMultiHostURL_EveryNodeAStandby_Answers503WithRetryAfter(t *testing.T) {
	c := newCluster(t)
	logs := logcount.New()
	logcount.CaptureDefault(t, logs)
	schema := c.freshSchema(t)
	primary, err := postgres.Open(inSchema(c.proxyURL, schema))
	require.NoError(t, err)
	t.Cleanup(func() { primary.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, orderservice.Setup(ctx, primary, "postgres"))

	ms, err := c.members()
	require.NoError(t, err)
	var standbys []string
	for _, m := range ms {
		if m.Role != "leader" {
			standbys = append(standbys, net.JoinHostPort(m.Host, strconv.Itoa(m.Port)))
		}
	}
	require.Len(t, standbys, 2, "members: %+v", ms)
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&target_session_attrs=read-write&search_path=%s",
		strings.Join(standbys, ","), schema))
	require.NoError(t, err)

	for _, m := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		t.Run(m.String(), func(t *testing.T) {
			db := postgres.OpenDB(*cfg) // no ping: no node takes writes
			t.Cleanup(func() { db.Close() })
			in := serve(t, 1, db, idempotency.Config{Mode: m, Lease: lease}, logs)
			// A write: the middleware's claim (claim-first) or its
			// transaction (single-phase) cannot begin. A read: the
			// service's own query classifies the error it meets.
			for _, a := range []answer{in.create("standbys-only-"+m.String(), orderservice.FirstSKU), in.get("O2026120400000000000000")} {
				require.NoError(t, a.err)
				require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a)
				require.NotEmpty(t, a.retryAfter, "%s", a)
				require.Less(t, a.took(), noHang, "%s", a)
			}
			logs.Log(t, "logged", 10)
		})
	}
}
