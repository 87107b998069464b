package idemgrpc

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/orderguard/idempotency"
)

// ErrorDomain is the domain of the ErrorInfo of the protocol's own answers
// (reasons KEY_REUSED, IN_PROGRESS, STORE_UNAVAILABLE and the others of
// doc.go's table): a reason in this domain is always the protocol's.
const ErrorDomain = "idempotency.orderguard"

// ServiceDomain is the domain ProblemStatus gives the ErrorInfo of a
// service's own problem kinds (coupon-unavailable: COUPON_UNAVAILABLE), so
// that a service's reason never passes for the protocol's. ProblemStatusIn
// names a domain of the service's own instead.
const ServiceDomain = "service.idempotency.orderguard"

// Keys of the ErrorInfo metadata that ProblemStatus writes: the problem's
// own HTTP status, type and title, so that a call's answer is recorded as
// its HTTP route's, finality included (Config.IsFinalFunc over the same
// status), and a client reads the answer as the HTTP contract's
// (ContractAnswer).
const (
	ErrorInfoHTTPStatus = "http_status"
	ErrorInfoType       = "type"
	ErrorInfoTitle      = "title"
)

// How answers are replayed: protojson reads the recorded JSON (answerJSON's,
// or the HTTP route's) into the response message, numbers or strings into
// 64-bit fields, null as unset; fields a newer recorder wrote are ignored.
var replayJSON = protojson.UnmarshalOptions{DiscardUnknown: true}

// record is what a handler's answer becomes in the record: a response as
// the HTTP route's JSON (answerJSON) under the method's OKStatus, an error
// as problem+json carrying its exact status, under its HTTP status
// (statusHTTP: the problem's own, else its code's), which decides with
// Config.IsFinalFunc whether it is recorded. header is the header metadata
// the handler set, canonical keys; the record keeps Content-Type,
// Location, ETag and Config.ReplayHeaders of it. The error returned is the
// call's answer to this run: the handler's (INTERNAL without its text:
// answerStatus), or INTERNAL for a response that could not be recorded.
func (m *method) record(ctx context.Context, resp any, handlerErr error, header map[string][]string) (idempotency.Result, error) {
	if handlerErr == nil {
		msg, ok := resp.(proto.Message)
		if !ok || msg == nil {
			handlerErr = status.Errorf(codes.Internal, "idemgrpc: %s answered %T, not a message", m.name, resp)
		} else if body, err := answerJSON(msg); err != nil {
			handlerErr = status.Errorf(codes.Internal, "idemgrpc: %s: record the response: %v", m.name, err)
		} else {
			return idempotency.Result{Status: m.OKStatus, Header: withContentType(header, "application/json"), Body: body}, nil
		}
	}
	st := m.answerStatus(ctx, handlerErr)
	httpStatus := statusHTTP(st)
	return idempotency.Result{
		Status: httpStatus,
		Header: withContentType(header, "application/problem+json"),
		Body:   statusProblem(st, httpStatus),
	}, st.Err()
}

// withContentType is header with the record's Content-Type, which
// describes the recorded body, whatever the handler set.
func withContentType(header map[string][]string, ct string) map[string][]string {
	h := make(map[string][]string, len(header)+1)
	for k, v := range header {
		h[k] = v
	}
	h["Content-Type"] = []string{ct}
	return h
}

// recordedProblem is a gRPC error as recorded: an RFC 9457 problem, so that
// a replay over HTTP is one, with the exact status for a replay over gRPC.
type recordedProblem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail,omitempty"`
	GRPCCode   string `json:"grpc_code,omitempty"`
	GRPCStatus []byte `json:"grpc_status,omitempty"` // google.rpc.Status, base64
}

// statusProblem records st under httpStatus. A status that ProblemStatus
// made is recorded as its problem, type, title and detail, as the HTTP
// route answers it; another's problem type is the kind its ErrorInfo in
// ErrorDomain or ServiceDomain names ("COUPON_UNAVAILABLE" is
// coupon-unavailable), else grpc-<code>, its title the code's name.
func statusProblem(st *status.Status, httpStatus int) []byte {
	raw, _ := proto.Marshal(st.Proto())
	name := st.Code().String()
	p := recordedProblem{
		Type:  idempotency.ProblemTypePrefix + "grpc-" + strings.ToLower(strings.ReplaceAll(name, "_", "-")),
		Title: name, Status: httpStatus, Detail: st.Message(),
		GRPCCode: name, GRPCStatus: raw,
	}
	if info := problemInfo(st); info != nil {
		if reason := info.GetReason(); reason != "" {
			p.Type = idempotency.ProblemTypePrefix + strings.ToLower(strings.ReplaceAll(reason, "_", "-"))
		}
		if t := info.GetMetadata()[ErrorInfoType]; t != "" {
			p.Type = t
		}
		if title := info.GetMetadata()[ErrorInfoTitle]; title != "" {
			p.Title = title
			p.Detail = strings.TrimPrefix(strings.TrimPrefix(st.Message(), title), ": ")
		}
	}
	body, _ := json.Marshal(p)
	return body
}

// problemInfo is st's ErrorInfo that names its problem: one that
// ProblemStatus wrote (its metadata carries the HTTP status), else one in
// ErrorDomain or ServiceDomain.
func problemInfo(st *status.Status) *errdetails.ErrorInfo {
	var found *errdetails.ErrorInfo
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		switch {
		case !ok:
		case info.GetMetadata()[ErrorInfoHTTPStatus] != "":
			return info
		case found == nil && (info.GetDomain() == ErrorDomain || info.GetDomain() == ServiceDomain):
			found = info
		}
	}
	return found
}

// statusHTTP is the HTTP status an error status stands for: the problem's
// own when ProblemStatus made it (ErrorInfoHTTPStatus), so that finality
// is decided as over HTTP, else its code's (HTTPStatus).
func statusHTTP(st *status.Status) int {
	if info := problemInfo(st); info != nil {
		if s, err := strconv.Atoi(info.GetMetadata()[ErrorInfoHTTPStatus]); err == nil && s >= 400 && s <= 599 {
			return s
		}
	}
	return HTTPStatus(st.Code())
}

// decodeAnswer is a replay in gRPC's terms: a recorded success decoded into
// a new response message, a recorded failure as its status.
func decodeAnswer(ans idempotency.Answer, newResponse func() proto.Message) (any, error) {
	if ans.Status < 400 {
		msg := newResponse()
		if len(ans.Body) == 0 {
			return msg, nil
		}
		if ct := contentType(ans.Header); ct != "application/json" {
			return nil, status.Errorf(codes.Internal, "idemgrpc: the recorded answer is %q, not JSON: it cannot be replayed as a message", ct)
		}
		if err := replayJSON.Unmarshal(ans.Body, msg); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: the recorded answer does not decode into %T: %v", msg, err)
		}
		return msg, nil
	}
	return nil, recordedStatus(ans).Err()
}

// recordedStatus is a recorded failure's status: the exact one a gRPC
// handler's error was recorded with, or, for an answer recorded over HTTP,
// its problem's (problemStatus) or its status code's.
func recordedStatus(ans idempotency.Answer) *status.Status {
	var p recordedProblem
	if json.Unmarshal(ans.Body, &p) == nil {
		if len(p.GRPCStatus) > 0 {
			var sp spb.Status
			if proto.Unmarshal(p.GRPCStatus, &sp) == nil {
				return status.FromProto(&sp)
			}
		}
		if p.Type != "" && p.Status == ans.Status {
			return ProblemStatus(&idempotency.Problem{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail})
		}
	}
	return status.New(Code(ans.Status), strings.TrimSpace(string(ans.Body)))
}

func contentType(h map[string][]string) string {
	v := h["Content-Type"]
	if len(v) == 0 {
		return ""
	}
	mt, _, err := mime.ParseMediaType(v[0])
	if err != nil {
		return v[0]
	}
	return mt
}

// The protocol's own answers: each problem kind's code and ErrorInfo
// reason. A kind not listed (a handler's own problem) maps by its status.
var problemCodes = map[string]struct {
	code   codes.Code
	reason string
}{
	idempotency.ProblemMissingKey:       {codes.InvalidArgument, "MISSING_KEY"},
	idempotency.ProblemInvalidKey:       {codes.InvalidArgument, "INVALID_KEY"},
	idempotency.ProblemInvalidBody:      {codes.InvalidArgument, "INVALID_MESSAGE"},
	idempotency.ProblemBodyTooLarge:     {codes.InvalidArgument, "MESSAGE_TOO_LARGE"},
	idempotency.ProblemUnsupportedMedia: {codes.InvalidArgument, "UNSUPPORTED_MEDIA_TYPE"},
	idempotency.ProblemScopeRequired:    {codes.Unauthenticated, "SCOPE_REQUIRED"},
	idempotency.ProblemKeyReused:        {codes.FailedPrecondition, "KEY_REUSED"},
	idempotency.ProblemInProgress:       {codes.Aborted, "IN_PROGRESS"},
	idempotency.ProblemStoreUnavailable: {codes.Unavailable, "STORE_UNAVAILABLE"},
	idempotency.ProblemCommitUnknown:    {codes.Unavailable, "COMMIT_OUTCOME_UNKNOWN"},
	idempotency.ProblemExecutionFailed:  {codes.Internal, "EXECUTION_FAILED"},
	idempotency.ProblemOutOfBounds:      {codes.InvalidArgument, "OUT_OF_BOUNDS"},
	idempotency.ProblemRerunRefused:     {codes.Unavailable, "RERUN_REFUSED"},
}

// ProblemStatus is a problem in gRPC's terms, for a handler to return
// (ProblemStatus(p).Err()) and for the interceptor's own answers:
//
//   - its code: the protocol's kinds by doc.go's table; a service's own by
//     its HTTP status (Code), but INVALID_ARGUMENT for invalid input, a 400
//     or a 422 whose kind is named invalid-… (invalid-quantity);
//   - its message: title and detail, the protocol's worded for gRPC
//     (metadata, RetryInfo: never headers or Retry-After);
//   - an ErrorInfo: its kind as the reason in upper snake case
//     (COUPON_UNAVAILABLE), in ErrorDomain for the protocol's kinds and
//     ServiceDomain for a service's own, with the problem's HTTP status,
//     type and title in its metadata (ErrorInfoHTTPStatus and the others),
//     so that the interceptor records the problem as the HTTP route
//     answers it and decides its finality from that status, whatever the
//     code;
//   - a RetryInfo when it says when to retry (Problem.RetryAfter); the
//     interceptor sends that delay as grpc-retry-pushback-ms too.
func ProblemStatus(p *idempotency.Problem) *status.Status {
	return ProblemStatusIn(ServiceDomain, p)
}

// ProblemStatusIn is ProblemStatus with a service's own kinds in the
// ErrorInfo domain of the service's choosing ("orders.example.com"); the
// protocol's kinds stay in ErrorDomain. An empty domain is ServiceDomain.
func ProblemStatusIn(domain string, p *idempotency.Problem) *status.Status {
	kind := p.Kind()
	c, protocol := problemCodes[kind]
	title, detail := p.Title, p.Detail
	switch {
	case protocol:
		domain = ErrorDomain
		title, detail = grpcWording.Replace(title), grpcWording.Replace(detail)
	default:
		c.code, c.reason = serviceCode(p.Status, kind), reasonOf(kind, p.Status)
		if domain == "" {
			domain = ServiceDomain
		}
	}
	msg := title
	if detail != "" {
		msg += ": " + detail
	}
	st := status.New(c.code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: c.reason, Domain: domain, Metadata: map[string]string{
		ErrorInfoHTTPStatus: strconv.Itoa(p.Status), ErrorInfoType: p.Type, ErrorInfoTitle: title,
	}}}
	if p.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(p.RetryAfter) * time.Second)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// grpcWording says in gRPC's terms what the protocol's problems say in
// HTTP's.
var grpcWording = strings.NewReplacer(
	"Send an Idempotency-Key header", "Send the metadata idempotency-key",
	"Idempotency-Key header", "idempotency-key metadata",
	"after Retry-After", "after the delay its RetryInfo gives",
	"Retry-After", "RetryInfo",
	"headers", "metadata",
	"header", "metadata",
)

// serviceCode is the code of a service's own problem: INVALID_ARGUMENT for
// invalid input (a 400, or a 422 of a kind named invalid-…), else its
// status's (Code). Finality never follows from it: the record keeps the
// problem's own status.
func serviceCode(httpStatus int, kind string) codes.Code {
	if httpStatus == http.StatusUnprocessableEntity && strings.HasPrefix(kind, "invalid-") {
		return codes.InvalidArgument
	}
	return Code(httpStatus)
}

// reasonOf is a problem kind as an ErrorInfo reason, [A-Z][A-Z0-9_]*: the
// kind's last segment (a type outside ProblemTypePrefix is a URI) in upper
// snake case, or HTTP_<status> for a kind that has no letters.
func reasonOf(kind string, httpStatus int) string {
	if i := strings.LastIndexAny(kind, "/:#"); i >= 0 {
		kind = kind[i+1:]
	}
	reason := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, kind)
	if reason == "" || reason[0] < 'A' || reason[0] > 'Z' {
		return "HTTP_" + strconv.Itoa(httpStatus)
	}
	return reason
}

// HTTPStatus is the HTTP status a gRPC code stands for in the record, for
// a handler's error that ProblemStatus did not make (one it made carries
// its problem's own status, ErrorInfoHTTPStatus), where the route's
// Config.IsFinalFunc decides whether it is final (by default: every status
// below 500 but 400, 408, 425 and 429):
//
//	OK 200                        NOT_FOUND 404 (final)
//	INVALID_ARGUMENT 400          ALREADY_EXISTS 409 (final)
//	UNAUTHENTICATED 401 (final)   FAILED_PRECONDITION 422 (final)
//	PERMISSION_DENIED 403 (final) OUT_OF_RANGE 422 (final)
//	RESOURCE_EXHAUSTED 429        UNIMPLEMENTED 501
//	DEADLINE_EXCEEDED 504         UNAVAILABLE, ABORTED, CANCELED 503
//	UNKNOWN, INTERNAL, DATA_LOSS 500
//
// FAILED_PRECONDITION is a business refusal (a coupon already used), which
// the same request meets again: 422, final. ABORTED and CANCELED say the
// call was not carried out and may be tried again: 503, not final. With
// Code it keeps finality both ways: for every status s, DefaultIsFinal(s)
// is DefaultIsFinal(HTTPStatus(Code(s))).
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists:
		return http.StatusConflict
	case codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusUnprocessableEntity
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable, codes.Aborted, codes.Canceled:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Code is the gRPC code of an HTTP status: of an answer recorded over HTTP,
// for its replay over gRPC, and of a service's problem (ProblemStatus).
// The statuses that say the request was not acted on map to codes that
// are retried, never to a final one:
//
//	< 400 OK                      409 ALREADY_EXISTS
//	400 INVALID_ARGUMENT          425 UNAVAILABLE (too early: later)
//	401 UNAUTHENTICATED           429 RESOURCE_EXHAUSTED
//	403 PERMISSION_DENIED         other 4xx FAILED_PRECONDITION
//	404 NOT_FOUND                 501 UNIMPLEMENTED
//	408 DEADLINE_EXCEEDED         502, 503 UNAVAILABLE
//	504 DEADLINE_EXCEEDED         other 5xx INTERNAL
func Code(httpStatus int) codes.Code {
	switch {
	case httpStatus < 400:
		return codes.OK
	case httpStatus == http.StatusBadRequest:
		return codes.InvalidArgument
	case httpStatus == http.StatusUnauthorized:
		return codes.Unauthenticated
	case httpStatus == http.StatusForbidden:
		return codes.PermissionDenied
	case httpStatus == http.StatusNotFound:
		return codes.NotFound
	case httpStatus == http.StatusRequestTimeout:
		return codes.DeadlineExceeded
	case httpStatus == http.StatusConflict:
		return codes.AlreadyExists
	case httpStatus == http.StatusTooEarly:
		return codes.Unavailable
	case httpStatus == http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case httpStatus < 500:
		return codes.FailedPrecondition
	case httpStatus == http.StatusNotImplemented:
		return codes.Unimplemented
	case httpStatus == http.StatusBadGateway, httpStatus == http.StatusServiceUnavailable:
		return codes.Unavailable
	case httpStatus == http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	default:
		return codes.Internal
	}
}
