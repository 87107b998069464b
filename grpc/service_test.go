package idemgrpc_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/timestamppb" // the test file's imports, registered
	_ "google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/orderguard/idempotency"
	idemgrpc "github.com/orderguard/idempotency/grpc"
	"github.com/orderguard/idempotency/internal/testdb"
)

// The test service, as generated code would register it: a unary create, a
// streaming watch, and an Order with a field of every shape a recorded
// answer must carry.
const testProto = `
name: "idemgrpc/test.proto"
package: "idemgrpc.test"
syntax: "proto3"
dependency: ["google/protobuf/wrappers.proto", "google/protobuf/timestamp.proto"]
message_type {
  name: "CreateOrderRequest"
  field { name: "sku" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "sku" }
  field { name: "quantity" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "quantity" }
}
message_type {
  name: "Line"
  field { name: "qty" number: 1 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "qty" }
}
message_type {
  name: "Order"
  field { name: "order_no" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "orderNo" }
  field { name: "total_cents" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "totalCents" }
  field { name: "coupon_id" number: 3 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "couponId" oneof_index: 1 proto3_optional: true }
  field { name: "discount_cents" number: 4 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "discountCents" }
  field { name: "line" number: 5 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".idemgrpc.test.Line" json_name: "line" }
  field { name: "line_ids" number: 6 label: LABEL_REPEATED type: TYPE_INT64 json_name: "lineIds" }
  field { name: "taxes" number: 7 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".idemgrpc.test.Order.TaxesEntry" json_name: "taxes" }
  field { name: "status" number: 8 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".idemgrpc.test.Status" json_name: "status" }
  field { name: "raw" number: 9 label: LABEL_OPTIONAL type: TYPE_BYTES json_name: "raw" }
  field { name: "ratio" number: 10 label: LABEL_OPTIONAL type: TYPE_DOUBLE json_name: "ratio" }
  field { name: "big" number: 11 label: LABEL_OPTIONAL type: TYPE_UINT64 json_name: "big" }
  field { name: "wrapped" number: 12 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" json_name: "wrapped" }
  field { name: "at" number: 13 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" json_name: "at" }
  field { name: "card" number: 14 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "card" oneof_index: 0 }
  field { name: "voucher" number: 15 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "voucher" oneof_index: 0 }
  nested_type {
    name: "TaxesEntry"
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "key" }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "value" }
    options { map_entry: true }
  }
  oneof_decl { name: "payment" }
  oneof_decl { name: "_coupon_id" }
}
enum_type {
  name: "Status"
  value { name: "STATUS_UNSPECIFIED" number: 0 }
  value { name: "CREATED" number: 1 }
}
service {
  name: "OrderService"
  method { name: "CreateOrder" input_type: ".idemgrpc.test.CreateOrderRequest" output_type: ".idemgrpc.test.Order" }
  method { name: "WatchOrders" input_type: ".idemgrpc.test.CreateOrderRequest" output_type: ".idemgrpc.test.Order" server_streaming: true }
}
`

// Full method names of the test service.
const (
	createOrder = "/idemgrpc.test.OrderService/CreateOrder"
	watchOrders = "/idemgrpc.test.OrderService/WatchOrders"
)

// The test service's message types, registered once as generated code
// registers its own.
var (
	registerOnce      sync.Once
	requestType       protoreflect.MessageType
	orderType         protoreflect.MessageType
	registeredService protoreflect.ServiceDescriptor
)

func registerTestService(t *testing.T) {
	t.Helper()
	registerOnce.Do(func() {
		var fdp descriptorpb.FileDescriptorProto
		if err := prototext.Unmarshal([]byte(testProto), &fdp); err != nil {
			panic(err)
		}
		fd, err := protodesc.NewFile(&fdp, protoregistry.GlobalFiles)
		if err != nil {
			panic(err)
		}
		if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
			panic(err)
		}
		for i := range fd.Messages().Len() {
			if err := protoregistry.GlobalTypes.RegisterMessage(dynamicpb.NewMessageType(fd.Messages().Get(i))); err != nil {
				panic(err)
			}
		}
		requestType = dynamicpb.NewMessageType(fd.Messages().ByName("CreateOrderRequest"))
		orderType = dynamicpb.NewMessageType(fd.Messages().ByName("Order"))
		registeredService = fd.Services().Get(0)
	})
}

// newRequest is a CreateOrderRequest.
func newRequest(t *testing.T, sku string, quantity int64) proto.Message {
	t.Helper()
	m := requestType.New()
	m.Set(m.Descriptor().Fields().ByName("sku"), protoreflect.ValueOfString(sku))
	m.Set(m.Descriptor().Fields().ByName("quantity"), protoreflect.ValueOfInt64(quantity))
	return m.Interface()
}

// newOrder is an Order with its number and total set.
func newOrder(orderNo string, total int64) proto.Message {
	m := orderType.New()
	m.Set(m.Descriptor().Fields().ByName("order_no"), protoreflect.ValueOfString(orderNo))
	m.Set(m.Descriptor().Fields().ByName("total_cents"), protoreflect.ValueOfInt64(total))
	return m.Interface()
}

func field(m proto.Message, name string) protoreflect.Value {
	r := m.ProtoReflect()
	return r.Get(r.Descriptor().Fields().ByName(protoreflect.Name(name)))
}

// handlerFunc is the test service's CreateOrder.
type handlerFunc func(ctx context.Context, req proto.Message) (proto.Message, error)

// serviceDesc serves CreateOrder with h, as generated code's
// RegisterOrderServiceServer would.
func serviceDesc(h handlerFunc) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "idemgrpc.test.OrderService",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "CreateOrder",
			Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := requestType.New().Interface()
				if err := dec(in); err != nil {
					return nil, err
				}
				run := func(ctx context.Context, req any) (any, error) { return h(ctx, req.(proto.Message)) }
				if interceptor == nil {
					return run(ctx, in)
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: createOrder}, run)
			},
		}},
	}
}

// testBundle is the test service over loopback, behind the interceptor
// when it has a Middleware.
type testBundle struct {
	addr  string
	conn  *grpc.ClientConn
	mw    *idempotency.Middleware
	store idempotency.Store
	runs  atomic.Int32 // handler runs
	calls atomic.Int32 // calls the server received
	log   *syncBuffer  // the Middleware's Logger
}

type bundleOptions struct {
	cfg         *idempotency.Config // nil: no idempotency interceptor
	serverOpts  []grpc.ServerOption
	dialOptions []grpc.DialOption
}

func setup(t *testing.T, opts bundleOptions, h handlerFunc) *testBundle {
	t.Helper()
	registerTestService(t)
	b := &testBundle{log: &syncBuffer{}}
	interceptors := []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		return next(ctx, req)
	}}
	if opts.cfg != nil {
		db, _ := testdb.MySQL(t)
		require.NoError(t, idempotency.Migrate(context.Background(), db))
		cfg := *opts.cfg
		cfg.Logger = slog.New(slog.NewTextHandler(b.log, nil))
		b.store = idempotency.NewMySQLStore(db)
		mw, err := idempotency.New(b.store, &cfg)
		require.NoError(t, err)
		b.mw = mw
		idem, err := idemgrpc.NewServerInterceptor(map[string]idemgrpc.Method{createOrder: {Middleware: mw}})
		require.NoError(t, err)
		interceptors = append(interceptors, idem)
	}
	srv := grpc.NewServer(append(opts.serverOpts, grpc.ChainUnaryInterceptor(interceptors...))...)
	srv.RegisterService(serviceDesc(func(ctx context.Context, req proto.Message) (proto.Message, error) {
		b.runs.Add(1)
		return h(ctx, req)
	}), nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	b.addr = lis.Addr().String()
	b.conn = b.dial(t, opts.dialOptions...)
	return b
}

// dial is a new connection to the bundle's server.
func (b *testBundle) dial(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(b.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// create calls CreateOrder.
func (b *testBundle) create(ctx context.Context, req proto.Message, opts ...grpc.CallOption) (proto.Message, error) {
	reply := orderType.New().Interface()
	err := b.conn.Invoke(ctx, createOrder, req, reply, opts...)
	return reply, err
}

// unreachableStore is a store whose database is never reached: enough to
// construct a Middleware.
func unreachableStore(t *testing.T) idempotency.Store {
	t.Helper()
	cfg := testdb.BaseConfig(t) // installs the driver's logger before any connector is made
	cfg.Addr, cfg.DBName = "127.0.0.1:1", "never"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return idempotency.NewMySQLStore(db)
}

// syncBuffer is a log destination that handlers write from several
// goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
