package idemgrpc_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/client"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

// The client interceptor retries what the server marked retryable, never
// grpc-go's own RESOURCE_EXHAUSTED: a message over the server's limit or
// over the client's own is sent once, since it meets the same limit again;
// a server's RESOURCE_EXHAUSTED that carries a problem's ErrorInfo is
// retried.
func TestClientInterceptor_ResourceExhausted_RetriedOnlyWhenTheServerMarkedIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		size     int
		callOpts []grpc.CallOption
		handler  handlerFunc
		attempts int32
	}{
		{name: "over the server's 4 MiB", size: 5 << 20, attempts: 1},
		{name: "over the client's MaxCallSendMsgSize", size: 2 << 20, callOpts: []grpc.CallOption{grpc.MaxCallSendMsgSize(1 << 20)}, attempts: 1},
		{name: "the server's rate limit", size: 1, attempts: 3, handler: func(context.Context, proto.Message) (proto.Message, error) {
			return nil, idemgrpc.ProblemStatus(idempotency.NewProblem(http.StatusTooManyRequests, "rate-limited", "Too many requests", "")).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var attempts atomic.Int32
			countAttempts := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				attempts.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			handler := tc.handler
			if handler == nil {
				handler = func(context.Context, proto.Message) (proto.Message, error) { return newOrder("O1", 1), nil }
			}
			b := setup(t, bundleOptions{dialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
				idemgrpc.UnaryClientInterceptor(client.Policy{MaxAttempts: 3, InitialDelay: time.Millisecond, MaxDelay: time.Millisecond}),
				countAttempts,
			)}}, handler)

			_, err := b.create(context.Background(), newRequest(t, strings.Repeat("x", tc.size), 1), tc.callOpts...)
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			require.Equal(t, tc.attempts, attempts.Load())
		})
	}
}
