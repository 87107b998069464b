package idempotency

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"
)

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
