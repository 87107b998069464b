package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/orderguard/idempotency"
)

// Metadata keys of the contract.
const (
	// MetadataKey carries the idempotency key of a call.
	MetadataKey = "idempotency-key"
	// ReplayedKey is set to "true" in the header metadata of a replayed
	// answer.
	ReplayedKey = "idempotent-replayed"
)

// Method protects one unary method.
type Method struct {
	// Middleware runs the protocol. Use one per method, as one per HTTP
	// route; the Middleware of an HTTP route that carries the same action
	// serves both (one replay cache, one route in the metrics, one action
	// per key). Required.
	Middleware *idempotency.Middleware

	// Scope returns the principal that owns the call's key, from the call's
	// context (what authentication established, spelled one way: see
	// idempotency.Config.ScopeFunc). An error is answered UNAUTHENTICATED.
	// Defaults to the empty scope for every call, which is safe for
	// single-tenant services only.
	Scope func(ctx context.Context) (string, error)

	// Fingerprint selects the request message's fields that make it the
	// same action (see Fingerprint). Defaults to every field. Leave it
	// unset when the Middleware declares an idempotency.Operation: the
	// operation's field lists apply.
	Fingerprint idempotency.FingerprintConfig

	// Route is the HTTP method and route of the same action, "POST
	// /orders": the fingerprint is the HTTP route's for the same business
	// fields, so one action is one action over both. Defaults to the
	// Route of the Middleware's idempotency.Operation, where the
	// message's fields of the route's path parameters fill them in
	// (CancelOrder {order_no: "X"} is POST /orders/X/cancel); without
	// one, to "POST" and the method's full name. Leave it unset when the
	// Middleware declares an Operation.
	Route string

	// OKStatus is the HTTP status recorded for a call answered OK: the
	// status the HTTP route of the same action answers (201 for a create),
	// so that its replay over HTTP is that route's. Defaults to the
	// Middleware's Operation.Status, else 200.
	OKStatus int

	// NewResponse returns an empty response message, into which a replay
	// decodes the recorded answer. Defaults to the method's output type in
	// protoregistry.GlobalTypes, where generated code registers it. It
	// must make the method's output type. The method's service must be in
	// protoregistry.GlobalFiles either way: a method the interceptor
	// cannot check could be streamed or misspelt, and never protected.
	NewResponse func() proto.Message
}

// NewServerInterceptor returns a unary server interceptor that protects the
// methods given by full name ("/orders.v1.OrderService/CreateOrder"); every
// other call passes through untouched. A method that its service's
// registered descriptor (protoregistry.GlobalFiles) does not have, or has
// as a streaming method, is an error: it would never be protected.
func NewServerInterceptor(methods map[string]Method) (grpc.UnaryServerInterceptor, error) {
	ready := make(map[string]*method, len(methods))
	for name, m := range methods {
		rm, err := newMethod(name, m)
		if err != nil {
			return nil, err
		}
		ready[name] = rm
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := ready[info.FullMethod]
		if !ok {
			return handler(ctx, req)
		}
		return m.serve(ctx, req, handler)
	}, nil
}

// method is a Method made ready.
type method struct {
	Method
	name        string
	httpMethod  string
	httpRoute   string
	fingerprint idempotency.JSONFingerprintFunc
	cfg         idempotency.Config
}

func newMethod(name string, m Method) (*method, error) {
	if m.Middleware == nil {
		return nil, fmt.Errorf("idemgrpc: method %s has no Middleware", name)
	}
	if !strings.HasPrefix(name, "/") || strings.Count(name, "/") != 2 {
		return nil, fmt.Errorf("idemgrpc: %q is not a full method name (/package.Service/Method)", name)
	}
	rm := &method{Method: m, name: name, cfg: m.Middleware.Config(), fingerprint: idempotency.NewJSONFingerprint(m.Fingerprint)}
	if rm.Scope == nil {
		rm.Scope = func(context.Context) (string, error) { return "", nil }
	}
	if op := rm.cfg.Operation; op != nil {
		// The action is declared once, on the Middleware: the method
		// translates its request into the operation's parameters.
		if m.Route != "" || len(m.Fingerprint.Fields)+len(m.Fingerprint.IgnoreFields) > 0 {
			return nil, fmt.Errorf("idemgrpc: method %s: its Middleware declares the action (Operation %q): leave Method.Route and Method.Fingerprint unset", name, op.Route)
		}
		rm.fingerprint = func(_, _ string, params []byte) (string, error) { return m.Middleware.FingerprintJSON(params) }
		if rm.OKStatus == 0 {
			rm.OKStatus = op.Status
		}
	}
	if rm.OKStatus == 0 {
		rm.OKStatus = http.StatusOK
	}
	if rm.OKStatus < 200 || rm.OKStatus > 299 {
		return nil, fmt.Errorf("idemgrpc: method %s: OKStatus %d is not a 2xx", name, rm.OKStatus)
	}
	rm.httpMethod, rm.httpRoute = http.MethodPost, name
	if m.Route != "" {
		verb, route, ok := strings.Cut(m.Route, " ")
		if !ok || verb == "" || !strings.HasPrefix(route, "/") {
			return nil, fmt.Errorf("idemgrpc: method %s: Route %q: want an HTTP method and route, \"POST /orders\"", name, m.Route)
		}
		rm.httpMethod, rm.httpRoute = verb, route
	}
	newResponse, err := registeredResponse(name, rm.NewResponse)
	if err != nil {
		return nil, err
	}
	rm.NewResponse = newResponse
	return rm, nil
}

// registeredResponse checks a method against the registry, where generated
// code registers its service, and returns how to make its response: a
// method must exist and be unary, or it would be silently unprotected (a
// unary interceptor never sees a stream), whether or not NewResponse is
// set; a NewResponse must make the method's output type. A service that is
// not registered is refused too: a misspelt service name would otherwise
// leave its method unprotected, and protoc-gen-go's code always registers.
func registeredResponse(fullMethod string, newResponse func() proto.Message) (func() proto.Message, error) {
	service, name, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: method %s: service %s is not in protoregistry.GlobalFiles: %w (import its generated package; a method the registry does not know would never be protected)", fullMethod, service, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: method %s: %s is a %T, not a service", fullMethod, service, d)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, fmt.Errorf("idemgrpc: service %s has no method %s: %s would never be protected", service, name, fullMethod)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("idemgrpc: method %s streams; only unary methods can be protected", fullMethod)
	}
	if newResponse != nil {
		if got := newResponse().ProtoReflect().Descriptor().FullName(); got != md.Output().FullName() {
			return nil, fmt.Errorf("idemgrpc: method %s answers %s; its NewResponse makes %s", fullMethod, md.Output().FullName(), got)
		}
		return newResponse, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: method %s's response type: %w", fullMethod, err)
	}
	return func() proto.Message { return mt.New().Interface() }, nil
}

// serve is one call: 1. the key from the metadata, 2. the scope, 3. the
// fingerprint over the request message, then the protocol (Do) with the
// handler as the action, and its answer in gRPC's terms.
func (m *method) serve(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: %s: request %T is not a proto.Message", m.name, req)
	}
	// 1. Key.
	key, err := m.readKey(ctx)
	if errors.Is(err, idempotency.ErrMissingKey) && m.cfg.KeyOptional {
		resp, err := handler(ctx, req) // unprotected, as Config.KeyOptional says
		if err != nil {
			return nil, m.answerStatus(ctx, err).Err()
		}
		return resp, nil
	}
	if err != nil {
		return nil, m.reject(ctx, err)
	}
	// 2. Scope.
	scope, err := m.Scope(ctx)
	if err != nil {
		var p *idempotency.Problem
		if !errors.As(err, &p) {
			p = idempotency.NewProblem(http.StatusUnauthorized, idempotency.ProblemScopeRequired, "Unauthenticated", err.Error())
		}
		return nil, m.reject(ctx, p)
	}
	// 3. Fingerprint.
	fp, err := m.readFingerprint(msg)
	if err != nil {
		return nil, m.reject(ctx, err)
	}
	// 4 to 7: the protocol, the handler run in the record's transaction,
	// its header metadata captured to be recorded with its answer.
	var resp any
	var handlerErr error
	var header *headerCapture
	ans := m.Middleware.Do(ctx, idempotency.Action{Scope: scope, Key: key, Fingerprint: fp},
		func(ctx context.Context) idempotency.Result {
			ctx, header = captureHeader(ctx, m.name)
			resp, handlerErr = handler(ctx, req)
			var res idempotency.Result
			res, handlerErr = m.record(ctx, resp, handlerErr, header.recorded())
			return res
		})
	resp, err = m.reply(ctx, ans, resp, handlerErr, header)
	setPushback(ctx, err)
	return resp, err
}

// readKey is step 1: exactly one idempotency-key, as valid as the header.
func (m *method) readKey(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	switch {
	case len(values) == 0 || (len(values) == 1 && strings.Trim(values[0], " \t") == ""):
		// A blank key is no key, as over HTTP and on a queue.
		return "", idempotency.ErrMissingKey
	case len(values) > 1:
		return "", fmt.Errorf("%w: send exactly one %s", idempotency.ErrInvalidKey, MetadataKey)
	}
	return idempotency.ParseKey(values[0], m.cfg.MaxKeyLength)
}

// readFingerprint is step 3, within the route's body limit.
func (m *method) readFingerprint(msg proto.Message) (string, error) {
	if size := proto.Size(msg); int64(size) > m.cfg.MaxBodyBytes {
		return "", fmt.Errorf("%w: a %d-byte message, limit %d", idempotency.ErrBodyTooLarge, size, m.cfg.MaxBodyBytes)
	}
	body, err := messageJSON(msg)
	if err != nil {
		return "", fmt.Errorf("%w: %v", idempotency.ErrInvalidBody, err)
	}
	return m.fingerprint(m.httpMethod, m.httpRoute, body)
}

// reject answers bad input through the protocol's refusal, so that it is
// observed as every front-end's is.
func (m *method) reject(ctx context.Context, err error) error {
	err = ProblemStatus(m.Middleware.Reject(ctx, err).Problem).Err()
	setPushback(ctx, err)
	return err
}

// reply turns the protocol's answer into the call's: the protocol's own
// problem (no header metadata, so that grpc-go's retry policy reads its
// pushback), the handler's own answer with the header metadata it set, or
// a replay of the recorded one with the recorded headers.
func (m *method) reply(ctx context.Context, ans idempotency.Answer, resp any, handlerErr error, header *headerCapture) (any, error) {
	switch {
	case ans.Problem != nil:
		return nil, ProblemStatus(ans.Problem).Err()
	case !ans.Replayed:
		if header != nil {
			header.send(ctx)
		}
		if handlerErr != nil {
			return nil, handlerErr
		}
		return resp, nil
	}
	_ = grpc.SetHeader(ctx, replayedHeader(ans.Header))
	return decodeAnswer(ans, m.NewResponse)
}

// answerStatus is a handler's error as the call answers it: its status,
// but a handler's failure (UNKNOWN, INTERNAL, DATA_LOSS: a raw error, a
// driver's text, a bug) with a generic message, its own logged to
// Config.Logger and never sent, since it may hold SQL or a database's
// names. Its details (a problem's ErrorInfo) are kept.
func (m *method) answerStatus(ctx context.Context, err error) *status.Status {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unknown, codes.Internal, codes.DataLoss:
	default:
		return st
	}
	attrs := []slog.Attr{slog.String("route", m.cfg.Route), slog.String("method", m.name),
		slog.String("code", st.Code().String()), slog.String("err", st.Message())}
	if scope, key, ok := idempotency.KeyFromContext(ctx); ok {
		attrs = append(attrs, slog.String("key_hash", idempotency.KeyHash(scope, key)))
	}
	m.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idemgrpc: the handler failed", attrs...)
	sp := st.Proto()
	sp.Code = int32(codes.Internal)
	sp.Message = "Internal error: the call failed on the server; its log has the cause."
	return status.FromProto(sp)
}
