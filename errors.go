package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// Sentinel errors. Stores and the middleware wrap them, so callers match with
// errors.Is and never see driver types.
var (
	// ErrMissingKey means the request carried no idempotency key although
	// one is required.
	ErrMissingKey = errors.New("idempotency: missing idempotency key")

	// ErrInvalidKey means the key header is present but not 1–MaxKeyLength
	// characters of visible ASCII (optionally as an RFC 8941 sf-string).
	ErrInvalidKey = errors.New("idempotency: invalid idempotency key")

	// ErrInvalidBody means the request body could not be read or, for a JSON
	// fingerprint, is not valid JSON (including duplicate object keys).
	ErrInvalidBody = errors.New("idempotency: invalid request body")

	// ErrBodyTooLarge means the request body exceeds Config.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("idempotency: request body too large")

	// ErrUnsupportedMediaType means the fingerprint needs a JSON body but the
	// request's Content-Type is not JSON.
	ErrUnsupportedMediaType = errors.New("idempotency: fingerprint needs a JSON body")

	// ErrRecordNotFound is returned by Store.Lookup when no record exists for
	// the scope and key.
	ErrRecordNotFound = errors.New("idempotency: record not found")

	// ErrKeyClaimed is returned by Store.Claim when a record for the scope and
	// key already exists. Look the record up to learn its state.
	ErrKeyClaimed = errors.New("idempotency: key already claimed")

	// ErrLeaseLost means a fenced statement matched no row: another attempt
	// took the record over (or it was released) after this attempt claimed it.
	// Whatever the caller did under the lost lease must be rolled back.
	ErrLeaseLost = errors.New("idempotency: lease lost")

	// ErrFingerprintMismatch means the key was used before with a request
	// whose fingerprint differs.
	ErrFingerprintMismatch = errors.New("idempotency: key reused with a different request")

	// ErrInProgress means another attempt holds the key and has not finished.
	ErrInProgress = errors.New("idempotency: request with this key is in progress")

	// ErrNoTransaction is returned by ExtendLease when the context does not
	// belong to a request executing under the middleware.
	ErrNoTransaction = errors.New("idempotency: context carries no idempotent execution")

	// ErrCommitUnknown means COMMIT failed without a server answer and the
	// record could not be re-read: the order may or may not exist. The key
	// stays claimed until its lease expires, so a retry can never execute twice.
	ErrCommitUnknown = errors.New("idempotency: commit outcome unknown")

	// ErrHandlerFailed means the wrapped handler itself failed: it panicked,
	// or its answer was too large to store. It is the only failure answered
	// 500; everything the infrastructure causes is answered 503.
	ErrHandlerFailed = errors.New("idempotency: handler failed")

	// ErrRerunRefused is what a front-end panics with when the middleware
	// asks it to run the handler again within one request (single-phase,
	// after the database rolled a run back or to renew a key past its
	// retention) and it cannot run it the way its framework runs a first
	// run: gin, for one, cannot undo an abort, so it cannot tell where a
	// run after an aborted run would have stopped. The middleware rolls the
	// run back, releases the key and answers 503 rerun-refused with
	// Retry-After, whatever Config.IsFinalFunc says: the retry is a new
	// request, which runs the handler as a first run.
	ErrRerunRefused = errors.New("idempotency: the front-end cannot run the handler again in this request")

	// ErrClaimOutOfBounds means a Claim would not fit the record table: an
	// empty key, a scope or key over 255 bytes, a fingerprint or owner
	// over 128, or a value the dialect's text columns cannot hold (see
	// TextChecker). SQLStore returns it before sending any statement,
	// whatever the schema would do with the value. The middleware never
	// sends such a claim to a store that says what it holds: it refuses the
	// request first. Should a store refuse one all the same, the request is
	// answered 400 out-of-bounds, never told to retry.
	ErrClaimOutOfBounds = errors.New("idempotency: claim does not fit the record table")
)

// Problem kinds: the stable last segment of every problem type URI.
const (
	ProblemMissingKey       = "missing-key"
	ProblemInvalidKey       = "invalid-key"
	ProblemInvalidBody      = "invalid-body"
	ProblemBodyTooLarge     = "body-too-large"
	ProblemUnsupportedMedia = "unsupported-media-type"
	ProblemScopeRequired    = "scope-required"
	ProblemKeyReused        = "key-reused"
	ProblemInProgress       = "in-progress"
	ProblemExecutionFailed  = "execution-failed"
	ProblemStoreUnavailable = "store-unavailable"
	ProblemCommitUnknown    = "commit-outcome-unknown"
	ProblemOutOfBounds      = "out-of-bounds"
	ProblemRerunRefused     = "rerun-refused"
)

// ProblemTypePrefix is prepended to a problem kind to form its RFC 9457 type.
const ProblemTypePrefix = "urn:orderguard:problem:"

// Problem is an RFC 9457 problem detail. The middleware answers every error
// with one, as application/problem+json. Handlers may write their own with
// WriteProblem so that clients see one error format.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`

	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int `json:"-"`
}

// NewProblem returns the problem of the given kind and status.
func NewProblem(status int, kind, title, detail string) *Problem {
	return &Problem{Type: ProblemTypePrefix + kind, Title: title, Status: status, Detail: detail}
}

// Kind returns the problem's kind, the type without ProblemTypePrefix.
func (p *Problem) Kind() string {
	if len(p.Type) > len(ProblemTypePrefix) && p.Type[:len(ProblemTypePrefix)] == ProblemTypePrefix {
		return p.Type[len(ProblemTypePrefix):]
	}
	return p.Type
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%s: %s", p.Title, p.Detail)
	}
	return p.Title
}

// WriteProblem writes p as application/problem+json.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen for this struct; keep the answer well-formed anyway
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// problemFor maps the middleware's own errors to their HTTP answer. Bad
// input is 4xx; ErrHandlerFailed (and an error this package does not know,
// such as a custom FingerprintFunc's) is 500; every other failure is of the
// infrastructure or a lost race and is answered 503 or 409 with Retry-After
// by the attempt (see attempt.problem).
func problemFor(err error, conflictStatus int) *Problem {
	var p *Problem
	switch {
	case errors.As(err, &p):
		return p
	case errors.Is(err, ErrMissingKey):
		return NewProblem(http.StatusBadRequest, ProblemMissingKey, "Idempotency key required",
			"Send an Idempotency-Key header that stays the same for every retry of this action.")
	case errors.Is(err, ErrInvalidKey):
		return NewProblem(http.StatusBadRequest, ProblemInvalidKey, "Invalid idempotency key", err.Error())
	case errors.Is(err, ErrBodyTooLarge):
		return NewProblem(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large", err.Error())
	case errors.Is(err, ErrUnsupportedMediaType):
		return NewProblem(http.StatusUnsupportedMediaType, ProblemUnsupportedMedia, "Unsupported media type", err.Error())
	case errors.Is(err, ErrInvalidBody):
		return NewProblem(http.StatusBadRequest, ProblemInvalidBody, "Invalid request body", err.Error())
	case errors.Is(err, ErrFingerprintMismatch):
		return NewProblem(conflictStatus, ProblemKeyReused, "Idempotency key reused",
			"This key was already used with a different request. Use a new key for a new action.")
	case errors.Is(err, ErrInProgress):
		return NewProblem(http.StatusConflict, ProblemInProgress, "Request in progress",
			"A request with this key is still being processed. Retry with the same key after Retry-After.")
	case errors.Is(err, ErrClaimOutOfBounds):
		return NewProblem(http.StatusBadRequest, ProblemOutOfBounds, "Request cannot be recorded", err.Error()+
			". The idempotency store cannot record this request's scope or key; the same request fails the same way again.")
	case errors.Is(err, ErrCommitUnknown):
		return NewProblem(http.StatusServiceUnavailable, ProblemCommitUnknown, "Outcome unknown",
			"The database connection failed during commit. Retry with the same key after Retry-After: the retry will see the real outcome.")
	case errors.Is(err, ErrRerunRefused):
		return NewProblem(http.StatusServiceUnavailable, ProblemRerunRefused, "Request not run again",
			"The handler had to run again within this request, which the server cannot do safely; nothing was recorded for this key. Retry with the same key after Retry-After.")
	case errors.Is(err, ErrHandlerFailed):
		return NewProblem(http.StatusInternalServerError, ProblemExecutionFailed, "Request failed",
			"The handler failed and was rolled back; nothing was recorded for this key. This is a server bug: a retry with the same key executes again.")
	default:
		return NewProblem(http.StatusInternalServerError, ProblemExecutionFailed, "Request failed",
			"The request failed; nothing was recorded for this key.")
	}
}

// problem is the answer to a failure after the request was accepted. Only
// the handler's own failure is a 500; any other failure came from the
// infrastructure or a lost race, nothing of it was recorded, and the client
// is told when to retry: 503 (or 409 in-progress) with Retry-After.
func (a *attempt) problem(err error) *Problem {
	p := problemFor(err, a.m.cfg.ConflictStatus)
	if p.Kind() == ProblemExecutionFailed && !errors.Is(err, ErrHandlerFailed) {
		p = storeUnavailable()
	}
	if p.Status == http.StatusServiceUnavailable || p.Kind() == ProblemInProgress {
		p.RetryAfter = max(1, int(math.Ceil(a.m.cfg.RetryAfter.Seconds())))
	}
	return p
}

// storeUnavailable is the answer to a fault of the infrastructure: the
// database could not be reached, lost the connection or rolled the
// transaction back (deadlock, lock wait timeout, snapshot or certification
// conflict). Nothing of the attempt was recorded.
func storeUnavailable() *Problem {
	return NewProblem(http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
		"The database failed for a moment and nothing was recorded for this key. Retry with the same key after Retry-After.")
}
