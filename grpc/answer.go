package idemgrpc

import (
	"encoding/json"
	"mime"
	"net/http"
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

// ErrorDomain is the domain of every ErrorInfo this package sends.
const ErrorDomain = "idempotency.orderguard"

// How answers are recorded and replayed: JSON with proto field names, which
// an answer recorded over HTTP for the same action also is; fields a newer
// recorder wrote are ignored on replay.
var (
	recordJSON = protojson.MarshalOptions{UseProtoNames: true}
	replayJSON = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// record is what a handler's answer becomes in the record: a response as
// JSON under the method's OKStatus, an error as problem+json carrying its
// exact status, under the HTTP status of its code (HTTPStatus), which
// decides with Config.IsFinalFunc whether it is recorded. The error
// returned is the call's answer to this run: the handler's, or INTERNAL for
// a response that could not be recorded.
func (m *method) record(resp any, handlerErr error) (idempotency.Result, error) {
	if handlerErr == nil {
		msg, ok := resp.(proto.Message)
		if !ok || msg == nil {
			handlerErr = status.Errorf(codes.Internal, "idemgrpc: %s answered %T, not a message", m.name, resp)
		} else if body, err := recordJSON.Marshal(msg); err != nil {
			handlerErr = status.Errorf(codes.Internal, "idemgrpc: %s: record the response: %v", m.name, err)
		} else {
			return idempotency.Result{Status: m.OKStatus, Header: jsonHeader(), Body: body}, nil
		}
	}
	st := status.Convert(handlerErr)
	return idempotency.Result{
		Status: HTTPStatus(st.Code()),
		Header: map[string][]string{"Content-Type": {"application/problem+json"}},
		Body:   statusProblem(st),
	}, handlerErr
}

func jsonHeader() map[string][]string {
	return map[string][]string{"Content-Type": {"application/json"}}
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

// statusProblem records st. Its problem type is the kind its ErrorInfo in
// ErrorDomain names (as ProblemStatus writes it: "COUPON_UNAVAILABLE" is
// coupon-unavailable), else grpc-<code>.
func statusProblem(st *status.Status) []byte {
	raw, _ := proto.Marshal(st.Proto())
	name := st.Code().String()
	kind := "grpc-" + name
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			kind = info.GetReason()
		}
	}
	body, _ := json.Marshal(recordedProblem{
		Type:  idempotency.ProblemTypePrefix + strings.ToLower(strings.ReplaceAll(kind, "_", "-")),
		Title: name, Status: HTTPStatus(st.Code()), Detail: st.Message(),
		GRPCCode: name, GRPCStatus: raw,
	})
	return body
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

// problemStatus is a problem in gRPC's terms: its code, an ErrorInfo with
// its reason, and a RetryInfo when it says when to retry.
func ProblemStatus(p *idempotency.Problem) *status.Status {
	kind := p.Kind()
	c, ok := problemCodes[kind]
	if !ok {
		c.code, c.reason = Code(p.Status), strings.ToUpper(strings.ReplaceAll(kind, "-", "_"))
	}
	msg := p.Title
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	st := status.New(c.code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: c.reason, Domain: ErrorDomain}}
	if p.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(p.RetryAfter) * time.Second)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// HTTPStatus is the HTTP status a gRPC code stands for in the record, where
// the route's Config.IsFinalFunc decides whether a handler's error is
// final (by default: every status below 500 but 400, 408, 425 and 429):
//
//	OK 200                      NOT_FOUND 404 (final)
//	INVALID_ARGUMENT 400        ALREADY_EXISTS 409 (final)
//	UNAUTHENTICATED 401 (final) FAILED_PRECONDITION 422 (final)
//	PERMISSION_DENIED 403 (final) OUT_OF_RANGE 422 (final)
//	RESOURCE_EXHAUSTED 429      UNIMPLEMENTED 501
//	DEADLINE_EXCEEDED 504       UNAVAILABLE, ABORTED, CANCELED 503
//	UNKNOWN, INTERNAL, DATA_LOSS 500
//
// FAILED_PRECONDITION is a business refusal (a coupon already used), which
// the same request meets again: 422, final. ABORTED and CANCELED say the
// call was not carried out and may be tried again: 503, not final.
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

// Code is the gRPC code of an answer recorded over HTTP with this status,
// for its replay over gRPC.
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
	case httpStatus == http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case httpStatus < 500:
		return codes.FailedPrecondition
	case httpStatus == http.StatusNotImplemented:
		return codes.Unimplemented
	case httpStatus == http.StatusServiceUnavailable:
		return codes.Unavailable
	case httpStatus == http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	default:
		return codes.Internal
	}
}
