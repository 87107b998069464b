package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Operation declares one action's identity once, for every front-end: the
// HTTP route that carries it and the parameters that make two requests the
// same action. Set it as Config.Operation, and the Middleware's HTTP
// Handler, the gRPC interceptor and the queue consumers that share the
// Middleware all compute one fingerprint for the same business request, so
// a key used over one transport is replayed over another, or refused as
// reused with other parameters, never executed twice. A front-end
// translates its request into the operation's parameters; it never
// redefines them.
//
// An operation's parameters are its route's path parameters and the
// members of a JSON object: the HTTP request's body (an empty body is the
// empty object), a gRPC request message written as JSON, a queued
// message's payload. A front-end without URLs reads each path parameter
// from the object's member of the same name ({order_no} from "order_no"),
// so a CancelOrder call {"order_no": "X"} is POST /orders/X/cancel. A path
// parameter never counts twice: over HTTP, a body member of its name must
// equal the path's value (ErrInvalidBody otherwise) and is left out.
type Operation struct {
	// Name names the action in observations and metrics, a bounded label
	// such as "create_order". Config.Route defaults to it.
	Name string

	// Route is the HTTP method and route of the action, path parameters
	// in braces, each a whole segment: "POST /orders",
	// "POST /orders/{order_no}/cancel". Required.
	Route string

	// Fields and IgnoreFields select the object's members that count, as
	// FingerprintConfig's field lists do (an absent member equals a null
	// one under Fields; IgnoreFields wins). Both empty: every member
	// counts.
	Fields, IgnoreFields []string

	// Status is the HTTP status of the action's success (201 for a
	// create): what a front-end without statuses records for its success,
	// so that a replay over HTTP is the route's own answer. Defaults to
	// 200.
	Status int
}

// operationTag starts every operation fingerprint's hash input, so that it
// never equals a FingerprintConfig fingerprint (fingerprintTag).
const operationTag = "orderguard-op-v1"

// operation is an Operation made ready: its route split, its field lists
// (and path parameters, left out of the object) as a filter.
type operation struct {
	Operation
	method   string
	template string   // the route as declared, "/orders/{order_no}/cancel"
	segments []string // template's segments; a parameter is "{name}"
	params   []string // the parameters' names, in path order
	fp       fingerprinter
}

func newOperation(op Operation) (*operation, error) {
	if op.Status == 0 {
		op.Status = http.StatusOK
	}
	if op.Status < 200 || op.Status > 299 {
		return nil, fmt.Errorf("idempotency: Operation %q: Status %d is not a 2xx", op.Name, op.Status)
	}
	method, template, ok := strings.Cut(op.Route, " ")
	if method != strings.ToUpper(method) {
		// HTTP's methods are case-sensitive and requests spell them in
		// upper case: "post" would never meet a request's "POST".
		return nil, fmt.Errorf("idempotency: Operation %q: Route %q: spell the method in upper case", op.Name, op.Route)
	}
	if !ok || method == "" || !strings.HasPrefix(template, "/") || strings.ContainsAny(template, " ?#") {
		return nil, fmt.Errorf("idempotency: Operation %q: Route %q: want an HTTP method and route, \"POST /orders/{order_no}/cancel\"", op.Name, op.Route)
	}
	o := &operation{Operation: op, method: method, template: template, segments: strings.Split(template, "/")}
	for _, seg := range o.segments {
		name, isParam := strings.CutPrefix(seg, "{")
		if !isParam && !strings.ContainsAny(seg, "{}") {
			continue
		}
		name, closed := strings.CutSuffix(name, "}")
		if !isParam || !closed || name == "" || strings.ContainsAny(name, "{}") {
			return nil, fmt.Errorf("idempotency: Operation %q: Route %q: a path parameter is a whole segment, {name}", op.Name, op.Route)
		}
		for _, p := range o.params {
			if p == name {
				return nil, fmt.Errorf("idempotency: Operation %q: Route %q names {%s} twice", op.Name, op.Route, name)
			}
		}
		o.params = append(o.params, name)
	}
	// A path parameter is one member of the object; left out of it, it
	// counts once, in the path.
	o.fp = newFingerprinter(FingerprintConfig{Fields: op.Fields, IgnoreFields: append(append([]string(nil), op.IgnoreFields...), o.params...)})
	if o.fp.filter == nil {
		// The object's members are always checked as field lists check
		// them (names that encoding/json would read alike are refused).
		o.fp.filter = &fieldFilter{byFold: map[string][]listedName{}}
	}
	return o, nil
}

// fingerprintRequest is the HTTP front-end's fingerprint: the path
// parameters from the request's path, the query, and the body, which must
// be empty or a JSON object.
func (o *operation) fingerprintRequest(r *http.Request, body []byte) (string, error) {
	if len(body) > 0 && !isJSONMediaType(r.Header.Get("Content-Type")) {
		return "", fmt.Errorf("%w: the operation's parameters are a JSON object: send Content-Type application/json, not %q",
			ErrUnsupportedMediaType, r.Header.Get("Content-Type"))
	}
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	query := ""
	if r.URL != nil {
		if route := CanonicalRoute(r); strings.Contains(route, "?") {
			_, query, _ = strings.Cut(route, "?")
		}
	}
	values, matched := o.pathValues(r.URL)
	if matched {
		if err := o.checkBodyParams(values, body); err != nil {
			return "", err
		}
	}
	if !matched {
		// Mounted where the route does not fit: the path as it is, which
		// no other transport's request can share.
		return o.sum(method, "path:"+canonicalPath(r.URL), nil, query, body)
	}
	return o.sum(method, o.template, values, query, body)
}

// pathValues matches the request's path to the route and returns the
// parameters' values, unescaped.
func (o *operation) pathValues(u *url.URL) ([]string, bool) {
	if u == nil {
		return nil, false
	}
	segs := strings.Split(u.EscapedPath(), "/")
	if len(segs) != len(o.segments) {
		return nil, false
	}
	var values []string
	for i, seg := range o.segments {
		if strings.HasPrefix(seg, "{") {
			v, err := url.PathUnescape(segs[i])
			if err != nil {
				return nil, false
			}
			values = append(values, v)
			continue
		}
		if v, err := url.PathUnescape(segs[i]); err != nil || v != seg {
			return nil, false
		}
	}
	return values, true
}

// checkBodyParams refuses a body member named as a path parameter whose
// value is not the path's: the body and the path would name two
// different actions, and a handler that read the body's would act on
// another than the fingerprint's.
func (o *operation) checkBodyParams(values []string, body []byte) error {
	if len(o.params) == 0 || len(trimJSONSpace(body)) == 0 {
		return nil
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return nil // the canonical form refuses it, with its reason
	}
	for i, name := range o.params {
		raw, ok := members[name]
		if !ok {
			continue
		}
		if v, err := pathValueOf(raw); err != nil || v != values[i] {
			return fmt.Errorf("%w: %s in the body is not the path's %q", ErrInvalidBody, name, values[i])
		}
	}
	return nil
}

// fingerprintJSON is the fingerprint of a request whose parameters are the
// JSON object params, its path parameters among its members. An empty
// payload is the empty object, as an HTTP request's empty body is.
func (o *operation) fingerprintJSON(params []byte) (string, error) {
	if len(trimJSONSpace(params)) == 0 {
		params = []byte("{}")
	}
	var values []string
	if len(o.params) > 0 {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(params, &members); err != nil {
			return "", fmt.Errorf("%w: the operation's parameters are a JSON object: %v", ErrInvalidBody, err)
		}
		for _, name := range o.params {
			v, err := pathValueOf(members[name])
			if err != nil {
				return "", fmt.Errorf("%w: %s: %v", ErrInvalidBody, name, err)
			}
			values = append(values, v)
		}
	}
	return o.sum(o.method, o.template, values, "", params)
}

// pathValueOf is a member as the path segment that carries it: a string as
// it is, a number or boolean in its canonical JSON form, null or absent as
// the empty segment.
func pathValueOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	if raw[0] == '{' || raw[0] == '[' {
		return "", fmt.Errorf("a path parameter is a string or a number, not %s", raw[:1])
	}
	b, err := CanonicalJSON(raw)
	return string(b), err
}

// sum is the hex SHA-256 of the tag, the method, the route, each path
// parameter's value, the query and the object in canonical form, each
// length-prefixed.
func (o *operation) sum(method, route string, values []string, query string, body []byte) (string, error) {
	if len(trimJSONSpace(body)) == 0 {
		body = []byte("{}")
	}
	c := getCanonicalizer()
	defer putCanonicalizer(c)
	buf := appendFramed(c.out[:0], operationTag)
	buf = appendFramed(buf, method)
	buf = appendFramed(buf, route)
	buf = appendFramed(buf, fmt.Sprint(len(values)))
	for _, v := range values {
		buf = appendFramed(buf, v)
	}
	buf = appendFramed(buf, query)
	c.out = buf
	if err := c.canonicalize(body, o.fp.filter); err != nil {
		return "", err
	}
	sum := sha256.Sum256(c.out)
	return hex.EncodeToString(sum[:]), nil
}

func trimJSONSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

// FingerprintJSON returns the fingerprint of the Middleware's
// Config.Operation for a request whose parameters are the JSON object
// params, its path parameters among its members: the fingerprint the
// Handler computes over HTTP for the same business request. Front-ends
// without URLs (a gRPC call written as JSON, a queued message) call it. It
// fails when the Middleware declares no Operation.
func (m *Middleware) FingerprintJSON(params []byte) (string, error) {
	if m.op == nil {
		return "", fmt.Errorf("idempotency: route %q declares no Operation", m.cfg.Route)
	}
	return m.op.fingerprintJSON(params)
}
