package idemgrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/orderguard/idempotency"
	idemgrpc "github.com/orderguard/idempotency/grpc"
)

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, key)
}

// The header metadata a handler sets (grpc.SetHeader, grpc.SendHeader) is
// recorded with its answer: the first answer carries all of it, a replay
// the headers the record keeps (Location, ETag, Config.ReplayHeaders),
// marked idempotent-replayed.
func TestServer_HandlerHeaderMetadata_RecordedAndReplayed(t *testing.T) {
	t.Parallel()
	for name, send := range map[string]func(context.Context, metadata.MD) error{
		"SetHeader": grpc.SetHeader, "SendHeader": grpc.SendHeader,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOptions{cfg: &idempotency.Config{ReplayHeaders: []string{"X-Order-Version"}}},
				func(ctx context.Context, _ proto.Message) (proto.Message, error) {
					if err := send(ctx, metadata.Pairs("location", "/orders/O1", "x-order-version", "3", "x-trace", "t-1")); err != nil {
						return nil, err
					}
					return newOrder("O1", 1000), nil
				})
			var first, replay metadata.MD
			_, err := b.create(withKey("k"), newRequest(t, "sku-1", 1), grpc.Header(&first))
			require.NoError(t, err)
			require.Equal(t, []string{"/orders/O1"}, first.Get("location"))
			require.Equal(t, []string{"t-1"}, first.Get("x-trace"), "the first answer carries every header the handler set")
			require.Empty(t, first.Get(idemgrpc.ReplayedKey))

			_, err = b.create(withKey("k"), newRequest(t, "sku-1", 1), grpc.Header(&replay))
			require.NoError(t, err)
			require.EqualValues(t, 1, b.runs.Load(), "the second call is a replay")
			require.Equal(t, []string{"true"}, replay.Get(idemgrpc.ReplayedKey))
			require.Equal(t, []string{"/orders/O1"}, replay.Get("location"), "Location is recorded")
			require.Equal(t, []string{"3"}, replay.Get("x-order-version"), "a Config.ReplayHeaders header is recorded")
			require.Empty(t, replay.Get("x-trace"), "a header the record does not keep is not replayed")
		})
	}
}

// An in-progress answer tells grpc-go's retry policy how long to wait: the
// trailer grpc-retry-pushback-ms carries its RetryInfo's delay, and a
// client whose service config retries ABORTED waits that long, not its own
// backoff of a millisecond, so its retry replays the first call's answer.
func TestServer_InProgress_RetryPolicyWaitsThePushback(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	aborted := make(chan struct{}, 64) // one per in-progress answer the server sent
	b := setup(t, bundleOptions{
		cfg: &idempotency.Config{RetryAfter: time.Second},
		serverOpts: []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			resp, err := next(ctx, req)
			if status.Code(err) == codes.Aborted {
				aborted <- struct{}{}
			}
			return resp, err
		})},
	}, func(context.Context, proto.Message) (proto.Message, error) {
		close(entered) // a second run would panic here: there is none
		<-release
		return newOrder("O1", 1000), nil
	})
	firstDone := make(chan error, 1)
	go func() {
		_, err := b.create(withKey("busy"), newRequest(t, "sku-1", 1))
		firstDone <- err
	}()
	<-entered // the first call holds the key

	// The trailer is there for any client to read.
	var trailer metadata.MD
	reply := orderType.New().Interface()
	err := b.dial(t, grpc.WithDisableRetry()).Invoke(withKey("busy"), createOrder, newRequest(t, "sku-1", 1), reply, grpc.Trailer(&trailer))
	require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	require.Equal(t, []string{"1000"}, trailer.Get(idemgrpc.PushbackKey), "the RetryInfo's second, in milliseconds")
	<-aborted

	const serviceConfig = `{"methodConfig": [{
		"name": [{"service": "idemgrpc.test.OrderService"}],
		"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
			"backoffMultiplier": 1, "retryableStatusCodes": ["ABORTED", "UNAVAILABLE"]}}]}`
	retrying := b.dial(t, grpc.WithDefaultServiceConfig(serviceConfig))
	start := time.Now()
	waiting := make(chan error, 1)
	order := orderType.New().Interface()
	go func() { waiting <- retrying.Invoke(withKey("busy"), createOrder, newRequest(t, "sku-1", 1), order) }()
	<-aborted // its first attempt was answered in progress
	close(release)
	require.NoError(t, <-firstDone)
	require.NoError(t, <-waiting, "the retry after the pushback replays the first call's answer")
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "the retry waited the pushback, not the 1ms backoff")
	require.Equal(t, "O1", field(order, "order_no").String())
	require.EqualValues(t, 1, b.runs.Load())
}

// Finality is decided as over HTTP whatever the code: a handler's problem
// is recorded under its own HTTP status (ErrorInfo http_status), and
// Config.IsFinalFunc decides over it. 408, 425 and 429 are released for a
// retry; 409 is final and ALREADY_EXISTS; an invalid input's 422 is final
// and INVALID_ARGUMENT.
func TestServer_HandlerProblem_FinalityOfItsHTTPStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		kind   string
		code   codes.Code
		final  bool
	}{
		{http.StatusRequestTimeout, "timeout", codes.DeadlineExceeded, false},
		{http.StatusTooEarly, "too-early", codes.Unavailable, false},
		{http.StatusTooManyRequests, "rate-limited", codes.ResourceExhausted, false},
		{http.StatusConflict, "duplicate-order", codes.AlreadyExists, true},
		{http.StatusUnprocessableEntity, "invalid-quantity", codes.InvalidArgument, true},
		{http.StatusUnprocessableEntity, "coupon-unavailable", codes.FailedPrecondition, true},
		{http.StatusBadRequest, "invalid-body", codes.InvalidArgument, false},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOptions{cfg: &idempotency.Config{}}, func(context.Context, proto.Message) (proto.Message, error) {
				return nil, idemgrpc.ProblemStatus(idempotency.NewProblem(tc.status, tc.kind, "Refused", "no")).Err()
			})
			for range 2 {
				_, err := b.create(withKey("k"), newRequest(t, "sku-1", 1))
				require.Equal(t, tc.code, status.Code(err), "%v", err)
				httpStatus, kind, _ := idemgrpc.ContractAnswer(status.Convert(err))
				require.Equal(t, tc.status, httpStatus, "the client reads the problem's own status")
				require.Equal(t, tc.kind, kind)
			}
			runs := int32(2)
			if tc.final {
				runs = 1 // recorded, then replayed
				rec, err := b.store.Lookup(context.Background(), "", "k")
				require.NoError(t, err)
				require.Equal(t, tc.status, rec.Snapshot.StatusCode, "an HTTP replay answers the problem's own status")
				require.JSONEq(t, fmt.Sprintf(`{"type":%q,"title":"Refused","status":%d,"detail":"no"}`, idempotency.ProblemTypePrefix+tc.kind, tc.status),
					string(problemFields(t, rec.Snapshot.Body)), "and the problem as the HTTP route writes it")
			}
			require.Equal(t, runs, b.runs.Load(), "final: %v", tc.final)
		})
	}
}

// problemFields is a recorded problem's RFC 9457 members, without the
// extension members that carry the gRPC status.
func problemFields(t *testing.T, body []byte) []byte {
	t.Helper()
	var p map[string]any
	require.NoError(t, json.Unmarshal(body, &p), "%s", body)
	for k := range p {
		if k != "type" && k != "title" && k != "status" && k != "detail" {
			delete(p, k)
		}
	}
	out, err := json.Marshal(p)
	require.NoError(t, err)
	return out
}

// A streaming method, or one the registered service does not have, is
// refused when the interceptor is made, NewResponse or not: it would never
// be protected; so is a service outside the registry, which cannot be
// checked (a misspelt service name is one).
func TestNewServerInterceptor_MethodsThatCannotBeProtected_Refused(t *testing.T) {
	t.Parallel()
	registerTestService(t)
	mw, err := idempotency.New(unreachableStore(t), nil)
	require.NoError(t, err)
	newOrder := func() proto.Message { return orderType.New().Interface() }
	for _, tc := range []struct {
		name, method string
		newResponse  func() proto.Message
		refused      string
	}{
		{"streaming", watchOrders, nil, "streams"},
		{"streaming with NewResponse", watchOrders, newOrder, "streams"},
		{"unknown method", "/idemgrpc.test.OrderService/CreateOrdre", nil, "no method"},
		{"unknown method with NewResponse", "/idemgrpc.test.OrderService/CreateOrdre", newOrder, "no method"},
		{"NewResponse of another type", createOrder, func() proto.Message { return &errdetails.ErrorInfo{} }, "NewResponse makes"},
		{"unregistered service without NewResponse", "/idemgrpc.elsewhere.Orders/Create", nil, "not in protoregistry"},
		{"unary", createOrder, nil, ""},
		{"unary with NewResponse", createOrder, newOrder, ""},
		{"unregistered service with NewResponse", "/idemgrpc.elsewhere.Orders/Create", newOrder, "not in protoregistry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{tc.method: {Middleware: mw, NewResponse: tc.newResponse}})
			if tc.refused == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.refused)
		})
	}
}

// A handler's failure never sends its text, which may hold SQL or a
// database's names: the call is INTERNAL with a generic message, and the
// text is logged.
func TestServer_HandlerFailure_DriverTextLoggedNotSent(t *testing.T) {
	t.Parallel()
	const driverText = "Error 1146 (42S02): Table 'shop.purchase_order' doesn't exist"
	for name, failure := range map[string]error{
		"raw error":       errors.New(driverText),
		"INTERNAL status": status.Error(codes.Internal, driverText),
		"execution-failed problem": idemgrpc.ProblemStatus(idempotency.NewProblem(http.StatusInternalServerError,
			idempotency.ProblemExecutionFailed, "Internal error", driverText)).Err(),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOptions{cfg: &idempotency.Config{}}, func(context.Context, proto.Message) (proto.Message, error) {
				return nil, failure
			})
			_, err := b.create(withKey("k"), newRequest(t, "sku-1", 1))
			st := status.Convert(err)
			require.Equal(t, codes.Internal, st.Code(), "%v", err)
			require.NotContains(t, st.Message(), "1146")
			require.NotContains(t, st.Message(), "purchase_order")
			require.Contains(t, b.log.String(), "purchase_order", "the cause is in the server's log")
		})
	}
}

// The protocol's answers over gRPC speak of metadata and RetryInfo, never
// of headers or Retry-After.
func TestProblemStatus_ProtocolAnswers_SpeakGRPC(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(unreachableStore(t), nil)
	require.NoError(t, err)
	for _, failure := range []error{
		idempotency.ErrMissingKey, idempotency.ErrInvalidKey, idempotency.ErrInProgress,
		idempotency.ErrCommitUnknown, idempotency.ErrRerunRefused, idempotency.ErrHandlerFailed,
		idempotency.ErrFingerprintMismatch, idempotency.ErrBodyTooLarge,
	} {
		t.Run(failure.Error(), func(t *testing.T) {
			p := mw.Reject(context.Background(), failure).Problem
			p.RetryAfter = 1
			msg := idemgrpc.ProblemStatus(p).Message()
			require.NotContains(t, strings.ToLower(msg), "header", "%q", msg)
			require.NotContains(t, msg, "Retry-After", "%q", msg)
		})
	}
}

// A service's own problem kinds have a domain of their own: its reasons
// never pass for the protocol's. The protocol's stay in ErrorDomain.
func TestProblemStatus_ServiceKinds_OutsideTheProtocolsDomain(t *testing.T) {
	t.Parallel()
	info := func(st *status.Status) *errdetails.ErrorInfo {
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				return i
			}
		}
		t.Fatalf("no ErrorInfo in %v", st.Proto())
		return nil
	}
	coupon := idempotency.NewProblem(http.StatusUnprocessableEntity, "coupon-unavailable", "Coupon unavailable", "used")
	got := info(idemgrpc.ProblemStatus(coupon))
	require.Equal(t, idemgrpc.ServiceDomain, got.GetDomain())
	require.Equal(t, "COUPON_UNAVAILABLE", got.GetReason())
	require.Equal(t, "422", got.GetMetadata()[idemgrpc.ErrorInfoHTTPStatus])
	require.Equal(t, "orders.example.com", info(idemgrpc.ProblemStatusIn("orders.example.com", coupon)).GetDomain())

	reused := idempotency.NewProblem(http.StatusConflict, idempotency.ProblemKeyReused, "Idempotency key reused", "")
	require.Equal(t, idemgrpc.ErrorDomain, info(idemgrpc.ProblemStatusIn("orders.example.com", reused)).GetDomain())
	require.Equal(t, "KEY_REUSED", info(idemgrpc.ProblemStatus(reused)).GetReason())
}

// Code and HTTPStatus keep finality both ways: a status that is final over
// HTTP maps to a code whose status is final, and one that is released for
// a retry (400, 408, 425, 429, 5xx) to one that is released too.
func TestCode_KeepsFinality(t *testing.T) {
	t.Parallel()
	for s := 400; s <= 599; s++ {
		c := idemgrpc.Code(s)
		require.Equal(t, idempotency.DefaultIsFinal(s), idempotency.DefaultIsFinal(idemgrpc.HTTPStatus(c)),
			"%d is %v, which is %d", s, c, idemgrpc.HTTPStatus(c))
	}
	for s, c := range map[int]codes.Code{
		http.StatusConflict: codes.AlreadyExists, http.StatusRequestTimeout: codes.DeadlineExceeded,
		http.StatusTooEarly: codes.Unavailable, http.StatusTooManyRequests: codes.ResourceExhausted,
	} {
		require.Equal(t, c, idemgrpc.Code(s), "Code(%d)", s)
	}
}

// A response is recorded as the HTTP route of the same action answers: proto
// field names in field order, every known field (zero values written, an
// unset field with presence null), 64-bit integers as JSON numbers, and a
// final newline; a replay over gRPC decodes it back into the same message.
func TestServer_RecordedResponse_IsTheHTTPRoutesJSON(t *testing.T) {
	t.Parallel()
	registerTestService(t)
	set := func(m proto.Message, name string, v protoreflect.Value) {
		r := m.ProtoReflect()
		r.Set(r.Descriptor().Fields().ByName(protoreflect.Name(name)), v)
	}
	sparse := newOrder("O1", 1234567890123)
	set(sparse, "voucher", protoreflect.ValueOfInt64(7))
	set(sparse, "status", protoreflect.ValueOfEnum(1))
	set(sparse, "big", protoreflect.ValueOfUint64(math.MaxUint64))
	set(sparse, "ratio", protoreflect.ValueOfFloat64(0.5))
	set(sparse, "wrapped", protoreflect.ValueOfMessage(wrapperspb.Int64(-5).ProtoReflect()))
	taxes := sparse.ProtoReflect().Mutable(sparse.ProtoReflect().Descriptor().Fields().ByName("taxes")).Map()
	taxes.Set(protoreflect.ValueOfString("vat").MapKey(), protoreflect.ValueOfInt64(19))
	taxes.Set(protoreflect.ValueOfString("city").MapKey(), protoreflect.ValueOfInt64(2))

	full := newOrder("O2", 900)
	set(full, "coupon_id", protoreflect.ValueOfInt64(0)) // set, at zero: not null
	set(full, "discount_cents", protoreflect.ValueOfInt64(100))
	set(full, "card", protoreflect.ValueOfString("visa"))
	set(full, "raw", protoreflect.ValueOfBytes([]byte{0, 1, 2}))
	set(full, "at", protoreflect.ValueOfMessage(timestamppb.New(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)).ProtoReflect()))
	line := full.ProtoReflect().Mutable(full.ProtoReflect().Descriptor().Fields().ByName("line")).Message()
	line.Set(line.Descriptor().Fields().ByName("qty"), protoreflect.ValueOfInt64(3))
	ids := full.ProtoReflect().Mutable(full.ProtoReflect().Descriptor().Fields().ByName("line_ids")).List()
	ids.Append(protoreflect.ValueOfInt64(1 << 60))

	for _, tc := range []struct {
		name  string
		order proto.Message
		json  string
	}{
		{"sparse", sparse, `{"order_no":"O1","total_cents":1234567890123,"coupon_id":null,"discount_cents":0,"line":null,` +
			`"line_ids":[],"taxes":{"city":2,"vat":19},"status":"CREATED","raw":"","ratio":0.5,"big":18446744073709551615,` +
			`"wrapped":-5,"at":null,"card":null,"voucher":7}` + "\n"},
		{"full", full, `{"order_no":"O2","total_cents":900,"coupon_id":0,"discount_cents":100,"line":{"qty":3},` +
			`"line_ids":[1152921504606846976],"taxes":{},"status":"STATUS_UNSPECIFIED","raw":"AAEC","ratio":0,"big":0,` +
			`"wrapped":null,"at":"2024-05-01T12:00:00Z","card":"visa","voucher":null}` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOptions{cfg: &idempotency.Config{}}, func(context.Context, proto.Message) (proto.Message, error) {
				return tc.order, nil
			})
			first, err := b.create(withKey("k"), newRequest(t, "sku-1", 1))
			require.NoError(t, err)
			rec, err := b.store.Lookup(context.Background(), "", "k")
			require.NoError(t, err)
			require.Equal(t, tc.json, string(rec.Snapshot.Body))
			require.Equal(t, "application/json", rec.Snapshot.Header.Get("Content-Type"))

			replay, err := b.create(withKey("k"), newRequest(t, "sku-1", 1))
			require.NoError(t, err)
			require.EqualValues(t, 1, b.runs.Load())
			require.True(t, proto.Equal(first, replay), "the replay decodes the record into the same message:\n%v\n%v", first, replay)
		})
	}
}

// A blank key is no key, as over HTTP and on a queue: MISSING_KEY, or,
// with KeyOptional, the call runs unprotected.
func TestServer_BlankKey_IsAMissingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOptions{cfg: &idempotency.Config{}}, func(context.Context, proto.Message) (proto.Message, error) {
		return newOrder("O1", 1000), nil
	})
	for _, blank := range []string{" ", "   "} { // grpc-go refuses a tab in metadata
		_, err := b.create(withKey(blank), newRequest(t, "sku-1", 1))
		st := status.Convert(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%q: %v", blank, err)
		_, kind, _ := idemgrpc.ContractAnswer(st)
		require.Equal(t, idempotency.ProblemMissingKey, kind, "%q", blank)
	}
	require.Zero(t, b.runs.Load())
}
