package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// FingerprintFunc computes a request's fingerprint from the request and its body,
// already read (at most Config.MaxBodyBytes). It returns a stable string; the
// middleware compares fingerprints for equality only.
type FingerprintFunc func(r *http.Request, body []byte) (string, error)

// FingerprintConfig selects what the default fingerprint covers. The zero
// value covers method, canonical route and the whole body.
//
// JSON numbers compare by value: 1, 1.0 and 1e0 share a fingerprint. That is
// safe because two bodies that both decode into the same Go type decode to
// equal values: integer types accept only integer spellings (1.0 into an int
// is a decode error, which the handler answers with a 400 that is not
// replayed), and equal decimal values parse to the same float.
//
// Field lists name top-level fields exactly, byte for byte, but
// encoding/json matches names to struct fields ignoring case (with Unicode
// simple folding, so "ſku_id" is "sku_id") and the last of several matching
// names wins. So with a field list set, a body whose top-level names are
// equal ignoring case ("quantity" and "QUANTITY"), or that spells a listed
// name in another case, is refused with ErrInvalidBody: otherwise the
// fingerprint could see one value while the handler decodes another.
// Nested objects need no such check, as they count whole.
type FingerprintConfig struct {
	// Fields is an allow-list of top-level JSON body fields (the seed's
	// "whitelist DTO"). When non-empty only these fields count, and an absent
	// field equals one that is null, so clients that omit optional fields and
	// clients that send them as null agree. Requires a JSON object body
	// whose names are distinct ignoring case.
	Fields []string

	// IgnoreFields is a deny-list of top-level JSON body fields dropped before
	// hashing, for values that change on every retry (timestamp, trace_id).
	// It wins over Fields. When non-empty it requires a JSON object body
	// whose names are distinct ignoring case.
	IgnoreFields []string

	// RouteFunc returns the route part of the fingerprint; nil means
	// CanonicalRoute. Override it to fingerprint a route template instead.
	RouteFunc func(*http.Request) string
}

// fingerprintTag starts every fingerprint's hash input. Changing the encoding
// must change the tag, so fingerprints of different versions never match.
const fingerprintTag = "orderguard-fp-v1"

// Body kinds: a raw body can never equal a canonical JSON body.
const (
	bodyKindJSON = "json"
	bodyKindRaw  = "raw"
)

// NewFingerprint returns the default FingerprintFunc for cfg.
//
// The fingerprint is the lowercase hex SHA-256 of the method, route, body kind
// and body, each length-prefixed, so no two different tuples share a hash
// input. JSON bodies (application/json, application/*+json) are hashed in
// their CanonicalJSON form after the field lists apply; other bodies are
// hashed as raw bytes, unless a field list is set, which needs JSON and so
// yields ErrUnsupportedMediaType. With a field list set, top-level names that
// are equal ignoring case yield ErrInvalidBody (see FingerprintConfig).
func NewFingerprint(cfg FingerprintConfig) FingerprintFunc {
	fp := newFingerprinter(cfg)
	routeOf := cfg.RouteFunc
	if routeOf == nil {
		routeOf = CanonicalRoute
	}
	return func(r *http.Request, body []byte) (string, error) {
		ct := r.Header.Get("Content-Type")
		isJSON := isJSONMediaType(ct)
		if !isJSON && fp.filter != nil {
			if ct == "" {
				return "", fmt.Errorf("%w: field lists need Content-Type application/json, request has none",
					ErrUnsupportedMediaType)
			}
			return "", fmt.Errorf("%w: field lists need Content-Type application/json, got %q",
				ErrUnsupportedMediaType, ct)
		}
		method := r.Method
		if method == "" { // net/http: an empty method means GET
			method = http.MethodGet
		}
		return fp.sum(method, routeOf(r), body, isJSON)
	}
}

// JSONFingerprintFunc computes the fingerprint of an action carried without
// HTTP (a gRPC call, a queued message) whose business parameters are a JSON
// object: see NewJSONFingerprint.
type JSONFingerprintFunc func(method, route string, body []byte) (string, error)

// NewJSONFingerprint returns the fingerprint that NewFingerprint(cfg) gives
// an HTTP request with this method, route (CanonicalRoute's form) and a
// JSON body, for front-ends of other transports. A front-end that names the
// HTTP method and route of the same action ("POST", "/orders") gets the
// fingerprint the HTTP route gets for the same business fields, so one
// action is one action whatever transport carries it: a key used over HTTP
// and then in a queued message is replayed, or refused as reused with other
// parameters, never executed twice. cfg.RouteFunc is not used.
func NewJSONFingerprint(cfg FingerprintConfig) JSONFingerprintFunc {
	fp := newFingerprinter(cfg)
	return func(method, route string, body []byte) (string, error) {
		return fp.sum(method, route, body, true)
	}
}

// fingerprinter is a FingerprintConfig made ready: its field lists as a
// filter, built once.
type fingerprinter struct {
	filter *fieldFilter
}

func newFingerprinter(cfg FingerprintConfig) fingerprinter {
	if len(cfg.Fields) == 0 && len(cfg.IgnoreFields) == 0 {
		return fingerprinter{}
	}
	// Copy into a map by folded name: one O(1) lookup per member finds a
	// listed name or a case variant of one, and later changes to cfg's
	// slices cannot alter fingerprints that are already stored.
	filter := &fieldFilter{
		hasAllow: len(cfg.Fields) > 0,
		byFold:   make(map[string][]listedName, len(cfg.Fields)+len(cfg.IgnoreFields)),
	}
	for _, f := range cfg.IgnoreFields {
		filter.add(f).deny = true
	}
	for _, f := range cfg.Fields {
		filter.add(f).allow = true
	}
	return fingerprinter{filter: filter}
}

// sum is the fingerprint of one request: the hex SHA-256 of the tag, the
// method, the route, the body's kind and the body, each length-prefixed.
func (fp fingerprinter) sum(method, route string, body []byte, isJSON bool) (string, error) {
	kind := bodyKindRaw
	if isJSON {
		kind = bodyKindJSON
	}
	c := getCanonicalizer()
	defer putCanonicalizer(c)
	buf := appendFramed(c.out[:0], fingerprintTag)
	buf = appendFramed(buf, method)
	buf = appendFramed(buf, route)
	buf = appendFramed(buf, kind)
	var sum [sha256.Size]byte
	if isJSON {
		// Canonicalise straight into the hash input behind a length
		// placeholder: one contiguous buffer, no hasher allocation.
		lenAt := len(buf)
		c.out = binary.BigEndian.AppendUint64(buf, 0)
		if err := c.canonicalize(body, fp.filter); err != nil {
			return "", err
		}
		binary.BigEndian.PutUint64(c.out[lenAt:], uint64(len(c.out)-lenAt-8))
		sum = sha256.Sum256(c.out)
	} else {
		// Stream raw bodies instead of copying them, as they may be large.
		c.out = binary.BigEndian.AppendUint64(buf, uint64(len(body)))
		h := sha256.New()
		h.Write(c.out)
		h.Write(body)
		h.Sum(sum[:0])
	}
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:]), nil
}

// appendFramed appends s behind its 8-byte big-endian length, so component
// boundaries are explicit and bytes cannot move between components unseen.
func appendFramed(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// isJSONMediaType reports whether ct names JSON: application/json or any
// application/*+json, parameters ignored.
func isJSONMediaType(ct string) bool {
	if ct == "application/json" { // the common case, without parsing
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" ||
		(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// CanonicalRoute returns the URL path plus the query with parameters sorted by
// name (encoded canonically with url.Values.Encode-like escaping), "?" only
// when a query exists. The values of one name keep the order they were sent
// in, because handlers see that order: r.URL.Query().Get("sku") is the first
// value, so ?sku=1&sku=2 and ?sku=2&sku=1 are different requests.
//
// The path keeps the client's %2F inside segments (a/b and a%2Fb are different
// resources) but otherwise uses one escaping, so the same path spelled with
// different escapes has one route. A query that does not parse is kept
// verbatim; it always holds a ';' or a bad escape, which the canonical
// encoding never produces, so it cannot equal any canonical query.
func CanonicalRoute(r *http.Request) string {
	if r.URL == nil {
		return ""
	}
	path := canonicalPath(r.URL)
	if r.URL.RawQuery == "" {
		return path
	}
	values, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return path + "?" + r.URL.RawQuery
	}
	if len(values) == 0 {
		return path
	}
	// Names are distinct map keys, so sorting them is stable by
	// construction; ParseQuery keeps each name's values in input order.
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	slices.Sort(names)
	var sb strings.Builder
	sb.WriteString(path)
	sep := byte('?')
	for _, k := range names {
		for _, v := range values[k] {
			sb.WriteByte(sep)
			sep = '&'
			sb.WriteString(url.QueryEscape(k))
			sb.WriteByte('=')
			sb.WriteString(url.QueryEscape(v))
		}
	}
	return sb.String()
}

// canonicalPath returns u's path in Go's default escaping, except that a %2F
// the client sent inside a segment stays escaped.
func canonicalPath(u *url.URL) string {
	if u.RawPath == "" {
		// The client used the default escaping, or none was needed.
		return u.EscapedPath()
	}
	segs := strings.Split(u.EscapedPath(), "/")
	for i, s := range segs {
		dec, err := url.PathUnescape(s)
		if err != nil { // cannot happen: EscapedPath is validly escaped
			continue
		}
		segs[i] = strings.ReplaceAll((&url.URL{Path: dec}).EscapedPath(), "/", "%2F")
	}
	return strings.Join(segs, "/")
}
