package main

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/grpcserver/ordergrpc"
	"github.com/orderguard/idempotency/examples/grpcserver/orderpb"
	idemgrpc "github.com/orderguard/idempotency/grpc"
	"github.com/orderguard/idempotency/internal/testbin"
	"github.com/orderguard/idempotency/internal/testdb"
)

// binary is this command, built once per test process.
func binary(t *testing.T) string { return testbin.Command(t, "grpcserver") }

// server is the command as a process: started, killed, started again on
// one address.
type server struct {
	t    *testing.T
	addr string
	args []string
	log  *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

func newServer(t *testing.T, args ...string) *server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	log, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
	require.NoError(t, err)
	s := &server{t: t, addr: addr, args: append([]string{"-addr", addr}, args...), log: log}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("server log:\n%s", out)
		}
		log.Close()
	})
	return s
}

// start starts the process and waits until its health service is SERVING.
func (s *server) start() {
	s.t.Helper()
	s.cmd = exec.Command(binary(s.t), s.args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(s.t, s.cmd.Start())
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(s.t, err)
	defer conn.Close()
	require.Eventually(s.t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 60*time.Second, 50*time.Millisecond, "the server never served")
}

// kill kills the process with SIGKILL, as a crash would, and waits for it.
func (s *server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// orderWrittenNotCommitted waits until the create of user's key has written
// its order and not committed it: a locking read of the order's row fails
// at once (NOWAIT) while the create's transaction holds it. It fails if
// the call ends first, or the order commits before it is seen.
func orderWrittenNotCommitted(t *testing.T, db *sql.DB, user, key string, callDone <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		tx, err := db.Begin()
		require.NoError(t, err)
		var n int
		err = tx.QueryRow(`SELECT COUNT(*) FROM purchase_order WHERE scope = ? AND idempotency_key = ? FOR UPDATE NOWAIT`, user, key).Scan(&n)
		_ = tx.Rollback()
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && (me.Number == 1205 || me.Number == 3572):
			return // locked by the create's open transaction
		case err != nil:
			t.Fatalf("locking read: %v", err)
		case n > 0:
			t.Fatal("the order committed before the test saw it uncommitted")
		}
		select {
		case <-callDone:
			t.Fatal("the call ended before its create wrote the order")
		case <-time.After(2 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the create never wrote its order within 60s")
	}
}

// A server killed with SIGKILL in the middle of a create (its order
// written, not committed) leaves the key to its lease; the client
// interceptor's call, under one key, retries through the outage and the
// restart, and ends with the one order, in both modes.
func TestKill9MidCall_TheRetryGetsTheOneOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"claim-first", "single-phase"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db, dsn := testdb.MySQL(t)
			s := newServer(t, "-db", "mysql://"+dsn, "-mode", mode, "-lease", "4s", "-handler-delay", "1500ms", "-reconcile-interval", "200ms")
			s.start()
			conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(client.Policy{
					InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond, MaxElapsed: 90 * time.Second,
				})))
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })

			ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(ordergrpc.UserMetadata, "7"))
			ctx = idemgrpc.WithKey(ctx, "killed-"+mode)
			type result struct {
				order *orderpb.Order
				err   error
			}
			done, ended := make(chan result, 1), make(chan struct{})
			go func() {
				o, err := orderpb.NewOrderServiceClient(conn).CreateOrder(ctx,
					&orderpb.CreateOrderRequest{UserId: 7, SkuId: 20001, Quantity: 1})
				done <- result{o, err}
				t.Logf("the call ended: %v, %v", o, err)
				close(ended)
			}()
			orderWrittenNotCommitted(t, db, "7", "killed-"+mode, ended)
			s.kill()
			s.start()
			r := <-done
			require.NoError(t, r.err, "the call, retried across the crash")
			var orders int
			require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM purchase_order WHERE scope = '7' AND idempotency_key = ?", "killed-"+mode).Scan(&orders))
			require.Equal(t, 1, orders, "one order for the key")
			var orderNo string
			require.NoError(t, db.QueryRow("SELECT order_no FROM purchase_order WHERE idempotency_key = ?", "killed-"+mode).Scan(&orderNo))
			require.Equal(t, orderNo, r.order.GetOrderNo(), "the call's answer is the order that exists")
		})
	}
}
