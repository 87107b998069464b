package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
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
	var filter *fieldFilter
	if len(cfg.Fields) > 0 || len(cfg.IgnoreFields) > 0 {
		// Copy into a map by folded name: one O(1) lookup per member finds
		// a listed name or a case variant of one, and later changes to
		// cfg's slices cannot alter fingerprints that are already stored.
		filter = &fieldFilter{
			hasAllow: len(cfg.Fields) > 0,
			byFold:   make(map[string][]listedName, len(cfg.Fields)+len(cfg.IgnoreFields)),
		}
		for _, f := range cfg.IgnoreFields {
			filter.add(f).deny = true
		}
		for _, f := range cfg.Fields {
			filter.add(f).allow = true
		}
	}
	routeOf := cfg.RouteFunc
	if routeOf == nil {
		routeOf = CanonicalRoute
	}
	return func(r *http.Request, body []byte) (string, error) {
		ct := r.Header.Get("Content-Type")
		isJSON := isJSONMediaType(ct)
		if !isJSON && filter != nil {
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
		kind := bodyKindRaw
		if isJSON {
			kind = bodyKindJSON
		}

		c := getCanonicalizer()
		defer putCanonicalizer(c)
		buf := appendFramed(c.out[:0], fingerprintTag)
		buf = appendFramed(buf, method)
		buf = appendFramed(buf, routeOf(r))
		buf = appendFramed(buf, kind)
		var sum [sha256.Size]byte
		if isJSON {
			// Canonicalise straight into the hash input behind a length
			// placeholder: one contiguous buffer, no hasher allocation.
			lenAt := len(buf)
			c.out = binary.BigEndian.AppendUint64(buf, 0)
			if err := c.canonicalize(body, filter); err != nil {
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

// CanonicalJSON re-encodes a JSON document canonically.
//
// Equal documents get equal bytes: object keys sorted by their UTF-8 bytes, no
// insignificant whitespace, strings escaped one way (only '"', '\' and control
// characters; \u00e9 and é are equal) and numbers in one decimal form
// (1, 1.0 and 10e-1 all become 1; 1.5 becomes 15e-1, 100 becomes 1e2) without
// losing precision. Numbers thus compare by value, not spelling, which is
// safe for fingerprints: documents that both decode into one Go type decode
// to equal values, since integer types accept only integer spellings and
// equal decimal values parse to the same float. Object keys compare exactly,
// case included. Documents that are ambiguous or malformed fail with
// ErrInvalidBody: invalid UTF-8, duplicate object keys, unpaired surrogate
// escapes, trailing data, nesting deeper than 10000 and exponents beyond ±1e9.
func CanonicalJSON(data []byte) ([]byte, error) {
	c := getCanonicalizer()
	defer putCanonicalizer(c)
	c.out = c.out[:0]
	if err := c.canonicalize(data, nil); err != nil {
		return nil, err
	}
	return bytes.Clone(c.out), nil
}

const (
	// maxJSONDepth matches encoding/json's nesting limit and bounds recursion.
	maxJSONDepth = 10000
	// maxJSONExponent bounds normalised exponents: no real request needs
	// more, and a bound keeps the int64 arithmetic far from overflow.
	maxJSONExponent = 1_000_000_000
	// maxPooledBuffer caps buffers kept in the pool, so one huge body does
	// not pin its memory for the life of the process.
	maxPooledBuffer = 256 << 10
)

// fieldFilter applies FingerprintConfig's field lists to the top-level object.
type fieldFilter struct {
	hasAllow bool // false: every field not denied counts
	// byFold maps the folded form of each listed name to the listed names
	// with that form (nearly always one), so one lookup finds both a listed
	// name and a name that is listed only ignoring case.
	byFold map[string][]listedName
}

type listedName struct {
	name        string
	allow, deny bool
	ownFold     bool // name is its own folded form
}

// add returns the entry for name, created if new.
func (f *fieldFilter) add(name string) *listedName {
	k := name
	if folded, same := appendFoldedName(nil, []byte(name)); !same {
		k = string(folded)
	}
	names := f.byFold[k]
	for i := range names {
		if names[i].name == name {
			return &names[i]
		}
	}
	f.byFold[k] = append(names, listedName{name: name, ownFold: k == name})
	return &f.byFold[k][len(f.byFold[k])-1]
}

// match returns the name of names, listed names of one folded form, that
// key is exactly, or nil; and when key is none of them, the first as
// misspelt.
func match(names []listedName, key []byte) (listed *listedName, misspelt string) {
	for i := range names {
		if names[i].name == string(key) {
			return &names[i], ""
		}
	}
	if len(names) > 0 {
		return nil, names[0].name
	}
	return nil, ""
}

// drops reports whether a member leaves the fingerprint: a denied one, and
// with an allow-list one not allowed or allowed but null, so that null
// equals an absent field. Deny wins.
func (f *fieldFilter) drops(listed *listedName, value []byte) bool {
	if listed != nil && listed.deny {
		return true
	}
	return f.hasAllow && (listed == nil || !listed.allow || string(value) == "null")
}

// appendFoldedName appends name folded so that two names fold alike exactly
// when bytes.EqualFold reports them equal, which is how encoding/json
// matches names to struct fields: each rune becomes one chosen rune of its
// unicode.SimpleFold orbit (so 'ſ' and 'S' become 's', the Kelvin sign
// 'k'). The chosen rune is the ASCII lower-case letter where the orbit has
// one, else its smallest rune, so that the usual lower-case names are their
// own folded form: then it appends nothing and reports same, to spare the
// copy. name must be valid UTF-8.
func appendFoldedName(dst, name []byte) (folded []byte, same bool) {
	i := 0
	// Skip eight bytes at a time while none is non-ASCII or in 'A'..'Z':
	// with the high bits cleared, adding 0x3f sets a byte's high bit from
	// 'A' up and adding 0x25 from 'Z'+1 up, never carrying into the next.
	const high = 0x8080808080808080
	for ; i+8 <= len(name); i += 8 {
		w := binary.LittleEndian.Uint64(name[i:])
		x := w &^ high
		if (w|(x+0x3f3f3f3f3f3f3f3f)&^(x+0x2525252525252525))&high != 0 {
			break
		}
	}
	for i < len(name) {
		b := name[i]
		if b >= utf8.RuneSelf {
			r, n := utf8.DecodeRune(name[i:])
			if foldRune(r) != r {
				break
			}
			i += n
			continue
		}
		if 'A' <= b && b <= 'Z' {
			break
		}
		i++
	}
	if i == len(name) {
		return dst, true
	}
	dst = append(dst, name[:i]...)
	for i < len(name) {
		b := name[i]
		if b < utf8.RuneSelf {
			if 'A' <= b && b <= 'Z' {
				b += 'a' - 'A'
			}
			dst = append(dst, b)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst, false
}

// foldRune returns the rune appendFoldedName chooses for r's orbit.
func foldRune(r rune) rune {
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	if 'A' <= smallest && smallest <= 'Z' {
		return smallest + 'a' - 'A'
	}
	return smallest
}

// foldedKey is a top-level key and its folded form in
// canonicalizer.folded, while checkFoldedKeys looks for equal forms.
type foldedKey struct {
	m               *jsonMember
	foldAt, foldLen int
}

// jsonMember locates one object member while its object is canonicalised.
type jsonMember struct {
	keyAt, keyLen int  // the unescaped key, in data or (escapedKey) in keys
	escapedKey    bool // the key had escapes, so it was decoded into keys
	drop          bool
	start, end    int // the canonical `"key":value` in out
}

// canonicalizer is a single-pass JSON validator and canonical encoder. It
// writes output as it parses and sorts each object's members in place when
// the object closes, so it needs no tree and no reflection. Instances are
// pooled: the buffers are reused across requests.
type canonicalizer struct {
	data    []byte
	pos     int
	depth   int
	out     []byte
	keys    []byte       // decoded keys that had escapes, stack-like
	members []jsonMember // members of the open objects, stack-like
	tmp     []byte       // scratch for reordering an object's members

	// Used only with a field filter, for the top-level object's keys.
	folded      []byte      // scratch for folded keys
	foldedKeys  []foldedKey // scratch for checkFoldedKeys
	foldChanged bool        // some key differs from its folded form
	misspelt    []byte      // the first key listed only ignoring case, if misspeltAs is set
	misspeltAs  string      // the listed name it folds to
}

var canonicalizerPool = sync.Pool{New: func() any { return new(canonicalizer) }}

func getCanonicalizer() *canonicalizer {
	return canonicalizerPool.Get().(*canonicalizer)
}

func putCanonicalizer(c *canonicalizer) {
	c.data, c.misspelt = nil, nil // do not keep the caller's body reachable
	if cap(c.out) > maxPooledBuffer || cap(c.tmp) > maxPooledBuffer ||
		cap(c.keys) > maxPooledBuffer || cap(c.members) > maxPooledBuffer/64 ||
		cap(c.folded) > maxPooledBuffer || cap(c.foldedKeys) > maxPooledBuffer/64 {
		return
	}
	canonicalizerPool.Put(c)
}

// canonicalize appends the canonical form of data to c.out. A non-nil filter
// applies to the top-level value, which must then be an object.
func (c *canonicalizer) canonicalize(data []byte, filter *fieldFilter) error {
	// Checking once up front keeps the string scanner simple: all bytes
	// >= 0x80 can then be copied through unexamined.
	if !utf8.Valid(data) {
		return fmt.Errorf("%w: JSON is not valid UTF-8", ErrInvalidBody)
	}
	c.data, c.pos, c.depth = data, 0, 0
	c.members, c.keys = c.members[:0], c.keys[:0]
	c.skipSpace()
	if filter != nil {
		c.foldChanged, c.misspelt, c.misspeltAs = false, nil, ""
		if c.pos == len(data) || data[c.pos] != '{' {
			return fmt.Errorf("%w: field lists need a JSON object at the top level", ErrInvalidBody)
		}
		if err := c.object(filter); err != nil {
			return err
		}
	} else if err := c.value(); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(data) {
		return c.syntaxError("data after the JSON value")
	}
	return nil
}

func (c *canonicalizer) syntaxError(what string) error {
	if c.pos >= len(c.data) {
		return fmt.Errorf("%w: JSON: unexpected end of input", ErrInvalidBody)
	}
	return fmt.Errorf("%w: JSON: %s at offset %d", ErrInvalidBody, what, c.pos)
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.data) {
		switch c.data[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value() error {
	if c.pos >= len(c.data) {
		return c.syntaxError("")
	}
	switch b := c.data[c.pos]; {
	case b == '{':
		return c.object(nil)
	case b == '[':
		return c.array()
	case b == '"':
		_, _, _, err := c.str(false)
		return err
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	default:
		return c.syntaxError(fmt.Sprintf("invalid character %q", b))
	}
}

func (c *canonicalizer) literal(lit string) error {
	if len(c.data)-c.pos < len(lit) || string(c.data[c.pos:c.pos+len(lit)]) != lit {
		return c.syntaxError("invalid literal")
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return nil
}

func (c *canonicalizer) enter() error {
	c.depth++
	if c.depth > maxJSONDepth {
		return c.syntaxError(fmt.Sprintf("nesting deeper than %d", maxJSONDepth))
	}
	return nil
}

func (c *canonicalizer) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return nil
	}
	for {
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.syntaxError("")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
			c.skipSpace()
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return nil
		default:
			return c.syntaxError("expected ',' or ']' in array")
		}
	}
}

func (c *canonicalizer) key(m *jsonMember) []byte {
	if m.escapedKey {
		return c.keys[m.keyAt : m.keyAt+m.keyLen]
	}
	return c.data[m.keyAt : m.keyAt+m.keyLen]
}

func (c *canonicalizer) keyLess(a, b *jsonMember) bool {
	return string(c.key(a)) < string(c.key(b))
}

// sortMembers sorts ms by key. Objects are mostly small, where a plain
// insertion sort beats the generic sort's indirect comparisons.
func (c *canonicalizer) sortMembers(ms []jsonMember) {
	if len(ms) > 16 {
		slices.SortFunc(ms, func(a, b jsonMember) int {
			return bytes.Compare(c.key(&a), c.key(&b))
		})
		return
	}
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && c.keyLess(&ms[j], &ms[j-1]); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// object canonicalises an object. Members are written in input order with
// commas; when the object closes they are checked for duplicates and, only if
// needed, reordered by key or filtered. Since members are compared with their
// neighbours after sorting, duplicates cost nothing extra to find.
func (c *canonicalizer) object(filter *fieldFilter) error {
	if err := c.enter(); err != nil {
		return err
	}
	openAt := c.pos
	c.pos++ // '{'
	objStart := len(c.out)
	c.out = append(c.out, '{')
	memBase, keyBase := len(c.members), len(c.keys)
	dropped := false
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return nil
	}
	for {
		if c.pos >= len(c.data) || c.data[c.pos] != '"' {
			return c.syntaxError("expected a string key in object")
		}
		if len(c.members) > memBase {
			c.out = append(c.out, ',')
		}
		start := len(c.out)
		keyAt, keyLen, escaped, err := c.str(true)
		if err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != ':' {
			return c.syntaxError("expected ':' after object key")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()
		valueStart := len(c.out)
		if err := c.value(); err != nil {
			return err
		}
		c.members = append(c.members, jsonMember{
			keyAt: keyAt, keyLen: keyLen, escapedKey: escaped, start: start, end: len(c.out),
		})
		if filter != nil && c.filterMember(filter, &c.members[len(c.members)-1], c.out[valueStart:]) {
			dropped = true
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.syntaxError("")
		}
		if c.data[c.pos] == ',' {
			c.pos++
			c.skipSpace()
			continue
		}
		if c.data[c.pos] != '}' {
			return c.syntaxError("expected ',' or '}' in object")
		}
		c.pos++
		break
	}

	ms := c.members[memBase:]
	sorted := true
	for i := 1; sorted && i < len(ms); i++ {
		sorted = c.keyLess(&ms[i-1], &ms[i])
	}
	if !sorted {
		c.sortMembers(ms)
		for i := 1; i < len(ms); i++ {
			if !c.keyLess(&ms[i-1], &ms[i]) {
				return fmt.Errorf("%w: JSON: duplicate key %q in the object at offset %d",
					ErrInvalidBody, c.key(&ms[i]), openAt)
			}
		}
	}
	if filter != nil {
		if err := c.checkFoldedKeys(ms); err != nil {
			return err
		}
	}
	if !sorted || dropped {
		c.tmp = append(c.tmp[:0], c.out[objStart:]...)
		c.out = c.out[:objStart+1]
		first := true
		for i := range ms {
			if ms[i].drop {
				continue
			}
			if !first {
				c.out = append(c.out, ',')
			}
			first = false
			c.out = append(c.out, c.tmp[ms[i].start-objStart:ms[i].end-objStart]...)
		}
	}
	c.out = append(c.out, '}')
	c.members, c.keys = c.members[:memBase], c.keys[:keyBase]
	c.depth--
	return nil
}

// filterMember applies the field lists to the top-level member m, noting
// whether its key differs from its folded form and whether it is a listed
// name only ignoring case, for checkFoldedKeys. It reports whether m is
// dropped.
func (c *canonicalizer) filterMember(filter *fieldFilter, m *jsonMember, value []byte) bool {
	key := c.key(m)
	// The common case first: a listed name that is its own folded form,
	// found without folding the key.
	names := filter.byFold[string(key)]
	for i := range names {
		if names[i].ownFold && names[i].name == string(key) {
			m.drop = filter.drops(&names[i], value)
			return m.drop
		}
	}
	if folded, same := appendFoldedName(c.folded[:0], key); !same {
		// Map keys are folded forms, so the lookup above missed: look up
		// the key's folded form instead.
		c.folded, c.foldChanged = folded[:0], true
		names = filter.byFold[string(folded)]
	}
	listed, misspelt := match(names, key)
	if misspelt != "" && c.misspeltAs == "" {
		// The key stays where it is (data or keys) until the object closes.
		c.misspelt, c.misspeltAs = key, misspelt
	}
	m.drop = filter.drops(listed, value)
	return m.drop
}

// checkFoldedKeys refuses a filtered top-level object, whose members ms
// have no duplicate keys, if encoding/json and the field lists could read
// its names differently: two names equal ignoring case (encoding/json
// decodes the last into one field, a strict decoder rejects the body, and
// no fingerprint can agree with both), or a name equal to a listed one only
// ignoring case (encoding/json decodes it into the listed field, the field
// lists treat it as another).
//
// When every key is its own folded form, as lower-case names are, equal
// folded forms would be equal keys, so there is nothing to look for.
// Otherwise sorting the folded forms finds equal ones in O(n log n) without
// allocating; ties sort in input order, so a pair is named as sent.
func (c *canonicalizer) checkFoldedKeys(ms []jsonMember) error {
	if c.foldChanged {
		c.folded, c.foldedKeys = c.folded[:0], c.foldedKeys[:0]
		for i := range ms {
			at := len(c.folded)
			folded, same := appendFoldedName(c.folded, c.key(&ms[i]))
			if same {
				folded = append(folded, c.key(&ms[i])...)
			}
			c.folded = folded
			c.foldedKeys = append(c.foldedKeys, foldedKey{m: &ms[i], foldAt: at, foldLen: len(folded) - at})
		}
		fks := c.foldedKeys
		slices.SortFunc(fks, func(a, b foldedKey) int {
			if d := bytes.Compare(c.foldOf(&a), c.foldOf(&b)); d != 0 {
				return d
			}
			return a.m.start - b.m.start // input order
		})
		for i := 1; i < len(fks); i++ {
			if bytes.Equal(c.foldOf(&fks[i-1]), c.foldOf(&fks[i])) {
				return fmt.Errorf("%w: JSON: names %+q and %+q are equal ignoring case; send each field once, spelled exactly",
					ErrInvalidBody, c.key(fks[i-1].m), c.key(fks[i].m))
			}
		}
	}
	if c.misspeltAs != "" {
		return fmt.Errorf("%w: JSON: name %+q is the field %+q ignoring case; spell listed fields exactly",
			ErrInvalidBody, c.misspelt, c.misspeltAs)
	}
	return nil
}

func (c *canonicalizer) foldOf(fk *foldedKey) []byte {
	return c.folded[fk.foldAt : fk.foldAt+fk.foldLen]
}

// str canonicalises the string at c.pos. For keys it also returns where the
// unescaped key is: in data when it had no escapes, else decoded into keys.
func (c *canonicalizer) str(isKey bool) (keyAt, keyLen int, escaped bool, err error) {
	d := c.data
	start := c.pos + 1
	i := start
	// Fast path: without escapes the input bytes are already canonical.
	for ; i < len(d); i++ {
		b := d[i]
		if b == '"' {
			c.out = append(c.out, d[c.pos:i+1]...)
			c.pos = i + 1
			return start, i - start, false, nil
		}
		if b == '\\' {
			break
		}
		if b < 0x20 {
			c.pos = i
			return 0, 0, false, c.syntaxError("control character in string")
		}
	}
	keyAt = len(c.keys)
	c.out = append(c.out, d[c.pos:i]...)
	if isKey {
		c.keys = append(c.keys, d[start:i]...)
	}
	for i < len(d) {
		b := d[i]
		switch {
		case b == '"':
			c.out = append(c.out, '"')
			c.pos = i + 1
			return keyAt, len(c.keys) - keyAt, true, nil
		case b < 0x20:
			c.pos = i
			return 0, 0, false, c.syntaxError("control character in string")
		case b != '\\':
			j := i + 1
			for j < len(d) && d[j] != '"' && d[j] != '\\' && d[j] >= 0x20 {
				j++
			}
			c.out = append(c.out, d[i:j]...)
			if isKey {
				c.keys = append(c.keys, d[i:j]...)
			}
			i = j
			continue
		}
		// An escape.
		c.pos = i
		if i+1 >= len(d) {
			return 0, 0, false, c.syntaxError("")
		}
		var r rune
		switch d[i+1] {
		case '"', '\\', '/':
			r = rune(d[i+1])
			i += 2
		case 'b':
			r, i = '\b', i+2
		case 'f':
			r, i = '\f', i+2
		case 'n':
			r, i = '\n', i+2
		case 'r':
			r, i = '\r', i+2
		case 't':
			r, i = '\t', i+2
		case 'u':
			r = hex4(d[i+2:])
			if r < 0 {
				return 0, 0, false, c.syntaxError("invalid \\u escape")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by a low one encodes a
				// character; anything else has no UTF-8 form.
				lo := rune(-1)
				if r < 0xdc00 && i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' {
					lo = hex4(d[i+2:])
				}
				r = utf16.DecodeRune(r, lo)
				if r == utf8.RuneError {
					return 0, 0, false, c.syntaxError("unpaired surrogate escape")
				}
				i += 6
			}
		default:
			return 0, 0, false, c.syntaxError("invalid escape")
		}
		c.out = appendStringRune(c.out, r)
		if isKey {
			c.keys = utf8.AppendRune(c.keys, r)
		}
	}
	c.pos = i
	return 0, 0, false, c.syntaxError("")
}

// hex4 decodes four hex digits at the start of b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, h := range b[:4] {
		switch {
		case h >= '0' && h <= '9':
			h -= '0'
		case h >= 'a' && h <= 'f':
			h -= 'a' - 10
		case h >= 'A' && h <= 'F':
			h -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(h)
	}
	return r
}

// appendStringRune appends r as it appears inside a canonical string: only
// '"', '\' and control characters are escaped, short forms where JSON has one.
func appendStringRune(b []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(b, '\\', byte(r))
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	if r < 0x20 {
		const digits = "0123456789abcdef"
		return append(b, '\\', 'u', '0', '0', digits[r>>4], digits[r&0xf])
	}
	return utf8.AppendRune(b, r)
}

// number canonicalises the number at c.pos from its text, never through a
// float (lossy) or an arbitrary-precision type (1e999999999 would be huge).
// The value is digits × 10^exp; leading and trailing zeros of the digits are
// stripped into exp and the result written as digits, then "e" and exp
// unless exp is 0. Zero, of either sign, is "0".
func (c *canonicalizer) number() error {
	d := c.data
	i := c.pos
	neg := d[i] == '-'
	if neg {
		i++
	}
	intStart := i
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		c.pos = i
		return c.syntaxError("invalid number")
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(d) && d[i] == '.' {
		i++
		fracStart = i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == fracStart {
			c.pos = i
			return c.syntaxError("invalid number")
		}
		fracEnd = i
	}
	var exp int64
	expOverflow := false
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		expNeg := false
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			expNeg = d[i] == '-'
			i++
		}
		expStart := i
		for ; i < len(d) && d[i] >= '0' && d[i] <= '9'; i++ {
			if exp < 1e17 {
				exp = exp*10 + int64(d[i]-'0')
			} else {
				expOverflow = true
			}
		}
		if i == expStart {
			c.pos = i
			return c.syntaxError("invalid number")
		}
		if expNeg {
			exp = -exp
		}
	}
	c.pos = i

	// The digits are d[intStart:intEnd] followed by d[fracStart:fracEnd];
	// find the first and last non-zero among them.
	intDigits, fracDigits := d[intStart:intEnd], d[fracStart:fracEnd]
	nInt := len(intDigits)
	digit := func(k int) byte {
		if k < nInt {
			return intDigits[k]
		}
		return fracDigits[k-nInt]
	}
	n := nInt + len(fracDigits)
	first := 0
	for first < n && digit(first) == '0' {
		first++
	}
	if first == n {
		c.out = append(c.out, '0')
		return nil
	}
	last := n - 1
	for digit(last) == '0' {
		last--
	}
	// Digit counts are bounded by the input's length, far below 1e17, so an
	// overflowing exponent is out of range whatever the digits are.
	e := exp - int64(len(fracDigits)) + int64(n-1-last)
	if expOverflow || e > maxJSONExponent || e < -maxJSONExponent {
		return fmt.Errorf("%w: JSON: number exponent out of range at offset %d", ErrInvalidBody, intStart)
	}
	if neg {
		c.out = append(c.out, '-')
	}
	if first < nInt {
		c.out = append(c.out, intDigits[first:min(last+1, nInt)]...)
	}
	if last >= nInt {
		c.out = append(c.out, fracDigits[max(first-nInt, 0):last+1-nInt]...)
	}
	if e != 0 {
		c.out = append(c.out, 'e')
		c.out = strconv.AppendInt(c.out, e, 10)
	}
	return nil
}
