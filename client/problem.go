package client

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
)

// ProblemTypePrefix starts the type URI of every problem the server sends.
const ProblemTypePrefix = "urn:orderguard:problem:"

// Problem kinds, as returned by Problem.Kind.
const (
	ProblemMissingKey       = "missing-key"            // 400: no key sent
	ProblemInvalidKey       = "invalid-key"            // 400: malformed key
	ProblemInvalidBody      = "invalid-body"           // 400: unreadable or invalid body
	ProblemBodyTooLarge     = "body-too-large"         // 413
	ProblemUnsupportedMedia = "unsupported-media-type" // 415
	ProblemScopeRequired    = "scope-required"         // 401
	ProblemKeyReused        = "key-reused"             // 409 or 422: final, never retry
	ProblemInProgress       = "in-progress"            // 409: retry with the same key
	ProblemExecutionFailed  = "execution-failed"       // 500: the handler failed (a bug); final, not retried
	ProblemStoreUnavailable = "store-unavailable"      // 503: retry with the same key
	ProblemCommitUnknown    = "commit-outcome-unknown" // 503: retry with the same key
	ProblemOutOfBounds      = "out-of-bounds"          // 400: the store cannot record this scope or key; final
	ProblemRerunRefused     = "rerun-refused"          // 503: retry with the same key
)

// maxProblemBytes bounds how much of a response body is buffered to parse a
// problem; the server's problems are far smaller.
const maxProblemBytes = 64 << 10

// Problem is an RFC 9457 problem detail as sent by the server.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Kind returns the problem's kind (one of the Problem* constants), or "" when
// p is nil or its type is not an orderguard problem type, so that a foreign
// problem is never mistaken for one of ours.
func (p *Problem) Kind() string {
	if p == nil {
		return ""
	}
	kind, ok := strings.CutPrefix(p.Type, ProblemTypePrefix)
	if !ok {
		return ""
	}
	return kind
}

// readProblem parses resp's body when it is application/problem+json and puts
// the bytes back in front of the unread rest, so the caller can still read the
// whole body. It returns nil for any other or unparsable body.
func readProblem(resp *http.Response) *Problem {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return nil
	}
	buf, readErr := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes+1))
	resp.Body = restoredBody{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
	if readErr != nil || len(buf) > maxProblemBytes {
		return nil
	}
	var p Problem
	if json.Unmarshal(buf, &p) != nil {
		return nil
	}
	return &p
}

// restoredBody replays peeked bytes but closes the original body.
type restoredBody struct {
	io.Reader
	io.Closer
}
