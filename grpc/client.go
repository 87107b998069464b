package idemgrpc

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/client"
)

type keyContext struct{}

// WithKey returns a context whose unary calls through
// UnaryClientInterceptor carry key: the one key of a business action, which
// a retry of the action reuses, in this process or after a restart
// (client.KeyFor derives one from a run and an action id).
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// UnaryClientInterceptor sends each unary call under one idempotency key and
// retries it under p, as package client does over HTTP: the key from
// WithKey (or already in the outgoing metadata), else one made for the call
// (client.NewKey), never one per attempt. It retries what the contract
// calls retryable (client.Retryable over ContractAnswer): UNAVAILABLE (a
// fault, or a connection lost before the answer: the retry learns the
// outcome), ABORTED (in progress, or a handler's conflict), a server's
// DEADLINE_EXCEEDED, and RESOURCE_EXHAUSTED only when the server marked it
// retryable (a problem's ErrorInfo, as ProblemStatus writes it, or a
// RetryInfo), waiting the server's RetryInfo where it sends one. grpc-go's
// own RESOURCE_EXHAUSTED (a message over a size limit, the server's or
// this client's) is final: the same message meets the same limit. An error
// the client produced without an answer is never retried unless it is
// UNAVAILABLE; the call's context ending stops the retries. Every other
// answer is final, KEY_REUSED above all. A key that is not valid (client's
// rules) fails the call with INVALID_ARGUMENT before anything is sent.
func UnaryClientInterceptor(p client.Policy) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, err := withCallKey(ctx)
		if err != nil {
			return err
		}
		var last error
		_, err = p.Retry(ctx, func(int) client.Outcome {
			last = invoker(ctx, method, req, reply, cc, opts...)
			if last == nil || ctx.Err() != nil {
				return client.Outcome{Err: last}
			}
			retry, wait := retryable(status.Convert(last))
			return client.Outcome{Retry: retry, Wait: wait, Err: last, Answered: true}
		})
		if last != nil {
			return last
		}
		return err
	}
}

// withCallKey puts the call's key into the outgoing metadata, unless one is
// there already.
func withCallKey(ctx context.Context) (context.Context, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	switch keys := md.Get(MetadataKey); len(keys) {
	case 0:
	case 1:
		if err := client.CheckKey(keys[0]); err != nil {
			return ctx, status.Errorf(codes.InvalidArgument, "idemgrpc: %v", err)
		}
		return ctx, nil
	default:
		return ctx, status.Errorf(codes.InvalidArgument, "idemgrpc: the call carries %d %s values; send one", len(keys), MetadataKey)
	}
	key, ok := ctx.Value(keyContext{}).(string)
	if !ok {
		key = client.NewKey()
	}
	if err := client.CheckKey(key); err != nil {
		return ctx, status.Errorf(codes.InvalidArgument, "idemgrpc: %v", err)
	}
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, key), nil
}

// retryable decides whether an attempt's failure is retried, and after
// what wait: as client.Retryable decides the HTTP answer it stands for
// (ContractAnswer), but a RESOURCE_EXHAUSTED only when the server marked
// it: the status grpc-go makes itself for a message over a size limit
// carries neither a problem's ErrorInfo nor a RetryInfo.
func retryable(st *status.Status) (bool, time.Duration) {
	httpStatus, kind, wait := ContractAnswer(st)
	if st.Code() == codes.ResourceExhausted && problemInfo(st) == nil && !hasRetryInfo(st) {
		return false, 0
	}
	return client.Retryable(httpStatus, kind), wait
}

func hasRetryInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}

// ContractAnswer is a status as the answer of the HTTP contract it stands
// for, so that client.Retryable decides for every transport alike: the HTTP
// status the answer has over HTTP (a problem's own, as ProblemStatus
// writes it in its ErrorInfo; else its code's), its problem kind (the
// problem's type; else the reason of an ErrorInfo in ErrorDomain, the
// protocol's, or ServiceDomain, a service's, in upper snake case), and the
// wait its RetryInfo asks for.
func ContractAnswer(st *status.Status) (httpStatus int, kind string, wait time.Duration) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			wait = ri.GetRetryDelay().AsDuration()
		}
	}
	reason, domain := "", ""
	if info := problemInfo(st); info != nil {
		reason, domain = info.GetReason(), info.GetDomain()
		if s, err := strconv.Atoi(info.GetMetadata()[ErrorInfoHTTPStatus]); err == nil && s >= 400 && s <= 599 {
			kind = strings.ToLower(strings.ReplaceAll(reason, "_", "-"))
			if t := info.GetMetadata()[ErrorInfoType]; t != "" {
				kind = (&idempotency.Problem{Type: t}).Kind()
			}
			return s, kind, wait
		}
	}
	for k, c := range problemCodes {
		if domain == ErrorDomain && c.reason == reason && c.code == st.Code() {
			return protocolStatus[k], k, wait
		}
	}
	if reason != "" {
		kind = strings.ToLower(strings.ReplaceAll(reason, "_", "-"))
	}
	switch st.Code() {
	case codes.Aborted, codes.Unavailable: // a handler's conflict or fault: retry
		return http.StatusServiceUnavailable, kind, wait
	}
	return HTTPStatus(st.Code()), kind, wait
}

// protocolStatus is the HTTP status of each of the protocol's problems.
var protocolStatus = map[string]int{
	idempotency.ProblemMissingKey:       http.StatusBadRequest,
	idempotency.ProblemInvalidKey:       http.StatusBadRequest,
	idempotency.ProblemInvalidBody:      http.StatusBadRequest,
	idempotency.ProblemBodyTooLarge:     http.StatusRequestEntityTooLarge,
	idempotency.ProblemUnsupportedMedia: http.StatusUnsupportedMediaType,
	idempotency.ProblemScopeRequired:    http.StatusUnauthorized,
	idempotency.ProblemKeyReused:        http.StatusConflict,
	idempotency.ProblemInProgress:       http.StatusConflict,
	idempotency.ProblemStoreUnavailable: http.StatusServiceUnavailable,
	idempotency.ProblemCommitUnknown:    http.StatusServiceUnavailable,
	idempotency.ProblemExecutionFailed:  http.StatusInternalServerError,
	idempotency.ProblemOutOfBounds:      http.StatusBadRequest,
	idempotency.ProblemRerunRefused:     http.StatusServiceUnavailable,
}
