package orderservice_test

import (
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// The property: two create-order bodies that get the same fingerprint and
// both decode into orderservice.CreateRequest decode to the same order.
// Otherwise a retry could replay an order the client did not ask for. The
// fuzz test and the generated test derive pairs of bodies by respellings the
// fingerprint must see through (member order, whitespace, escapes, number
// spellings) and by changes it must not see through (case and Unicode folds
// of names, folded duplicates, nesting, nulls, other values).

// createOrderFields is the allow-list orderservice.New gives create_order.
var createOrderFields = []string{"user_id", "sku_id", "quantity", "coupon_id"}

// orderFields are the fingerprinted fields of a CreateRequest (OrderNo is
// deliberately not fingerprinted).
type orderFields struct {
	UserID, SKUID int64
	Quantity      int
	CouponID      string // "absent" or the value
}

func fingerprintedFields(r *orderservice.CreateRequest) orderFields {
	f := orderFields{UserID: r.UserID, SKUID: r.SKUID, Quantity: r.Quantity, CouponID: "absent"}
	if r.CouponID != nil {
		f.CouponID = strconv.FormatInt(*r.CouponID, 10)
	}
	return f
}

type propertyCheck struct {
	fp idempotency.FingerprintFunc
	r  *http.Request
}

func newPropertyCheck() *propertyCheck {
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	return &propertyCheck{
		fp: idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: createOrderFields}),
		r:  r,
	}
}

// sameFingerprintDecodesAlike fails t if a and b share a fingerprint, both
// decode, and decode to different orders. It reports whether the pair got
// that far, so a test can tell it is not vacuous.
func (p *propertyCheck) sameFingerprintDecodesAlike(t testing.TB, a, b string) (compared bool) {
	t.Helper()
	fa, err := p.fp(p.r, []byte(a))
	if err != nil {
		require.ErrorIs(t, err, idempotency.ErrInvalidBody, "body %q", a)
		return false
	}
	fb, err := p.fp(p.r, []byte(b))
	if err != nil {
		require.ErrorIs(t, err, idempotency.ErrInvalidBody, "body %q", b)
		return false
	}
	if fa != fb {
		return false
	}
	var ra, rb orderservice.CreateRequest
	if json.Unmarshal([]byte(a), &ra) != nil || json.Unmarshal([]byte(b), &rb) != nil {
		return false
	}
	require.Equal(t, fingerprintedFields(&ra), fingerprintedFields(&rb),
		"one fingerprint, two orders:\n%q\n%q", a, b)
	return a != b
}

// checkDerivedPairs checks body against a body derived from it by rng, and
// against its projection onto the exactly spelled listed fields, which is
// what the field list claims to see. It returns how many pairs of different
// bodies shared a fingerprint and decoded.
func (p *propertyCheck) checkDerivedPairs(t testing.TB, body string, rng *rand.Rand) (compared int) {
	t.Helper()
	count := func(ok bool) {
		if ok {
			compared++
		}
	}
	derived := derive(rng, body)
	count(p.sameFingerprintDecodesAlike(t, body, derived))
	count(p.sameFingerprintDecodesAlike(t, derived, derive(rng, derived)))
	if ms, ok := parseObject(body); ok {
		count(p.sameFingerprintDecodesAlike(t, body, render(nil, keepListed(ms))))
	}
	return compared
}

func FuzzFingerprint_SameFingerprintDecodesAlike(f *testing.F) {
	for _, seed := range []struct {
		body     string
		selector uint64
	}{
		// Issue 10: a case or Unicode fold variant of an allowed name is
		// decoded by encoding/json (the last one wins) but was invisible
		// to the allow-list.
		{`{"user_id":7,"sku_id":20001,"quantity":1,"QUANTITY":50}`, 0},
		{`{"user_id":7,"sku_id":20001,"quantity":1,"QUANTITY":50}`, 1},
		{`{"user_id":7,"ſku_id":20002,"sku_id":20001,"quantity":1}`, 0},
		{`{"user_id":7,"sku_id":20001,"ſku_id":20002,"quantity":1}`, 2},
		{"{\"user_id\":7,\"sku_id\":20001,\"s\u212au_id\":20002,\"quantity\":1}", 3},
		{`{"user_id":7,"sku_id":20001,"s\u212Au_id":20002,"quantity":1}`, 4},
		{`{"user_id":7,"sku_id":20001,"quantity":1,"qu\u0041ntity":50}`, 5},
		{`{"user_id":7,"sku_id":20001,"quantity":1,"coupon_id":17,"COUPON_ID":18}`, 6},
		{`{"user_id":7,"sku_id":20001,"quantity":1}`, 7},
		{`{"user_id":7,"sku_id":20001,"quantity":1}`, 8},
		// Numbers compare by value; spellings that are not integers do
		// not decode into the integer fields, big integers overflow.
		{`{"quantity":1.0}`, 9},
		{`{"quantity":1e0}`, 10},
		{`{"quantity":10e-1,"user_id":0.7e1}`, 11},
		{`{"user_id":9223372036854775807,"sku_id":9223372036854775808,"quantity":1}`, 12},
		{`{"user_id":-9223372036854775808,"sku_id":18446744073709551616,"quantity":-0}`, 13},
		// Escapes, nulls, nesting, whitespace, and bodies that are not
		// JSON objects.
		{`{"\u0075ser_id":7,"sku_id":20001,"quantity":1,"order_no":"O\u002d1"}`, 14},
		{`{"user_id":7,"sku_id":20001,"quantity":1,"coupon_id":null,"order_no":"x"}`, 15},
		{`{"user_id":7,"sku_id":{"v":20001},"quantity":[1]}`, 16},
		{` { "quantity" : 2 , "user_id" : 7 } `, 17},
		{`[1,2]`, 18},
		{`not json`, 19},
	} {
		f.Add(seed.body, seed.selector)
	}
	check := newPropertyCheck()
	f.Fuzz(func(t *testing.T, body string, selector uint64) {
		check.checkDerivedPairs(t, body, rand.New(rand.NewPCG(selector, 10)))
	})
}

func TestFingerprint_SameFingerprintDecodesAlike_OnGeneratedPairs(t *testing.T) {
	t.Parallel()
	check := newPropertyCheck()
	rng := rand.New(rand.NewPCG(2026, 10))
	compared := 0
	for range 4000 {
		compared += check.checkDerivedPairs(t, generateBody(rng), rng)
	}
	// Most pairs differ in fingerprint or fail to decode; enough must get
	// to the comparison for the property to say something.
	require.Greater(t, compared, 1000)
	t.Logf("%d pairs of different bodies shared a fingerprint and decoded", compared)
}

// member is a top-level object member: its name, unescaped, and its value
// as sent.
type member struct {
	name  string
	value string
}

// parseObject splits body into its top-level members in order, duplicates
// kept. ok is false unless body is one JSON object.
func parseObject(body string) (members []member, ok bool) {
	dec := json.NewDecoder(strings.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		members = append(members, member{name: tok.(string), value: string(raw)})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return members, true
}

func keepListed(ms []member) []member {
	var kept []member
	for _, m := range ms {
		if slices.Contains(createOrderFields, m.name) {
			kept = append(kept, m)
		}
	}
	return kept
}

// Values the generator and the transformations use: valid integers mostly,
// so that bodies decode, and spellings that must not decode into an int.
var (
	intValues   = []string{"0", "1", "2", "7", "17", "50", "20001", "20002", "-1", "-0", "9223372036854775807"}
	otherValues = []string{"null", "1.0", "1e0", "10e-1", "0.1e1", "1E+0", "9223372036854775808",
		"-9223372036854775809", "18446744073709551616", `"1"`, `"x"`, "true", `{"v":1}`, "[1]", "[]", "{}"}
	otherNames = []string{"order_no", "note", "sku", "kind", "qty"}
)

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func someValue(rng *rand.Rand) string {
	if rng.IntN(4) == 0 {
		return pick(rng, otherValues)
	}
	return pick(rng, intValues)
}

// generateBody returns a create-order body: some listed fields, sometimes
// other fields, sometimes a name that folds to one already there.
func generateBody(rng *rand.Rand) string {
	var ms []member
	for _, name := range createOrderFields {
		if rng.IntN(5) > 0 {
			ms = append(ms, member{name, someValue(rng)})
		}
	}
	for rng.IntN(3) == 0 {
		ms = append(ms, member{pick(rng, otherNames), `"` + pick(rng, otherNames) + `"`})
	}
	if rng.IntN(3) == 0 {
		ms = append(ms, member{foldVariant(rng, pick(rng, slices.Concat(createOrderFields, otherNames))), someValue(rng)})
	}
	rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	return render(rng, ms)
}

// derive transforms body by one to three transformations chosen by rng.
// A body that is not a JSON object only gets textual transformations.
func derive(rng *rand.Rand, body string) string {
	ms, ok := parseObject(body)
	if !ok {
		return deriveText(rng, body)
	}
	for range 1 + rng.IntN(3) {
		ms = transform(rng, ms)
	}
	return render(rng, ms)
}

func transform(rng *rand.Rand, ms []member) []member {
	at := func() int { return rng.IntN(len(ms)) }
	anyName := func() string {
		if len(ms) > 0 && rng.IntN(2) == 0 {
			return ms[at()].name
		}
		return pick(rng, createOrderFields)
	}
	insert := func(m member) []member { return slices.Insert(ms, rng.IntN(len(ms)+1), m) }
	switch rng.IntN(10) {
	case 0: // reorder members
		rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	case 1: // respell a number, keeping its value
		if len(ms) > 0 {
			i := at()
			ms[i].value = respellNumber(rng, ms[i].value)
		}
	case 2: // another value
		if len(ms) > 0 {
			ms[at()].value = someValue(rng)
		}
	case 3: // a name in another case or Unicode fold
		if len(ms) > 0 {
			i := at()
			ms[i].name = foldVariant(rng, ms[i].name)
		}
	case 4: // a duplicate, or a folded duplicate, with another value
		name := anyName()
		if rng.IntN(2) == 0 {
			name = foldVariant(rng, name)
		}
		ms = insert(member{name, someValue(rng)})
	case 5: // nest a value
		if len(ms) > 0 {
			i := at()
			if rng.IntN(2) == 0 {
				ms[i].value = `{"v":` + ms[i].value + `}`
			} else {
				ms[i].value = `[` + ms[i].value + `]`
			}
		}
	case 6: // null for an allowed field, which equals its absence
		name := pick(rng, createOrderFields)
		if i := slices.IndexFunc(ms, func(m member) bool { return m.name == name }); i >= 0 {
			ms[i].value = "null"
		} else {
			ms = insert(member{name, "null"})
		}
	case 7: // drop a member
		if len(ms) > 0 {
			i := at()
			ms = slices.Delete(ms, i, i+1)
		}
	case 8: // add a field outside the allow-list
		ms = insert(member{pick(rng, otherNames), someValue(rng)})
	case 9: // keep the exactly spelled listed fields only
		ms = keepListed(ms)
	}
	return ms
}

// deriveText transforms an arbitrary string textually.
func deriveText(rng *rand.Rand, body string) string {
	switch rng.IntN(4) {
	case 0:
		return strings.Replace(body, "s", "ſ", 1)
	case 1:
		return strings.Replace(body, "k", "\u212a", 1)
	case 2:
		return strings.Replace(body, "{", `{"QUANTITY":50,`, 1)
	default:
		return " " + body + "\n"
	}
}

// foldVariant returns name with some letters in another case, some s as ſ
// (U+017F) and some k as the Kelvin sign (U+212A), changed at least once
// when name has a letter.
func foldVariant(rng *rand.Rand, name string) string {
	variant := func(r rune) rune {
		switch {
		case (r == 's' || r == 'S') && rng.IntN(3) == 0:
			return 'ſ'
		case (r == 'k' || r == 'K') && rng.IntN(3) == 0:
			return '\u212a'
		case r == 'ſ':
			return pick(rng, []rune{'s', 'S'})
		case r == '\u212a':
			return pick(rng, []rune{'k', 'K'})
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}
	rs := []rune(name)
	changed := false
	for i, r := range rs {
		if rng.IntN(2) == 0 {
			rs[i] = variant(r)
			changed = changed || rs[i] != r
		}
	}
	for i, r := range rs {
		if changed {
			break
		}
		rs[i] = variant(r)
		changed = rs[i] != r
	}
	return string(rs)
}

// respellNumber returns another spelling of the same value when v is a JSON
// number, else v: 1 as 1e0, 10e-1, 0.1e1 or 1.0.
func respellNumber(rng *rand.Rand, v string) string {
	neg, digits, exp, ok := splitNumber(v)
	if !ok {
		return v
	}
	sign := ""
	if neg {
		sign = "-"
	}
	if digits == "" { // zero
		return sign + pick(rng, []string{"0", "0.0", "0e5", "0.000E-3"})
	}
	e := func(n int) string { return strconv.Itoa(n) }
	plus := "+"
	if exp < 0 {
		plus = ""
	}
	spellings := []string{
		digits + "e" + e(exp),
		digits + "0e" + e(exp-1),
		"0." + digits + "e" + e(exp+len(digits)),
		digits + "E" + plus + e(exp),
	}
	if exp >= 0 && exp < 30 {
		spellings = append(spellings, digits+strings.Repeat("0", exp)+".0")
	}
	if exp < 0 && -exp < len(digits) {
		spellings = append(spellings, digits[:len(digits)+exp]+"."+digits[len(digits)+exp:]+"00")
	}
	return sign + pick(rng, spellings)
}

// splitNumber splits a JSON number into sign, digits without leading zeros
// ("" for zero) and the exponent of their last digit.
func splitNumber(v string) (neg bool, digits string, exp int, ok bool) {
	if !json.Valid([]byte(v)) || v == "" || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return false, "", 0, false
	}
	if neg = v[0] == '-'; neg {
		v = v[1:]
	}
	mantissa, e, hasExp := strings.Cut(strings.ToLower(v), "e")
	if hasExp {
		n, err := strconv.Atoi(e)
		if err != nil || n > 1e6 || n < -1e6 {
			return false, "", 0, false
		}
		exp = n
	}
	intPart, frac, _ := strings.Cut(mantissa, ".")
	exp -= len(frac)
	digits = strings.TrimLeft(intPart+frac, "0")
	return neg, digits, exp, true
}

// render writes members as a JSON object. With rng it varies whitespace and
// escapes characters of names and string values as \uXXXX at random; with
// a nil rng it writes them compactly.
func render(rng *rand.Rand, ms []member) string {
	var b strings.Builder
	space := func() {
		if rng != nil {
			b.WriteString(pick(rng, []string{"", "", " ", "\n", "\t", "\r\n  "}))
		}
	}
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		space()
		writeString(&b, rng, m.name)
		space()
		b.WriteByte(':')
		space()
		value := m.value
		var s string
		if rng != nil && strings.HasPrefix(value, `"`) && json.Unmarshal([]byte(value), &s) == nil {
			var vb strings.Builder
			writeString(&vb, rng, s)
			value = vb.String()
		}
		b.WriteString(value)
		space()
	}
	b.WriteByte('}')
	return b.String()
}

// writeString writes s as a JSON string, escaping some characters as \uXXXX
// (surrogate pairs beyond the BMP) when rng is set.
func writeString(b *strings.Builder, rng *rand.Rand, s string) {
	escapeSome := rng != nil && rng.IntN(3) == 0
	b.WriteByte('"')
	for _, r := range s {
		escape := escapeSome && rng.IntN(2) == 0
		switch {
		case escape && r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			b.WriteString(`\u` + hex4(hi) + `\u` + hex4(lo))
		case escape || r < 0x20 || r == '"' || r == '\\':
			b.WriteString(`\u` + hex4(r))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// hex4 returns r, at most U+FFFF, as four hex digits.
func hex4(r rune) string {
	h := strconv.FormatInt(int64(r), 16)
	return strings.Repeat("0", 4-len(h)) + strings.ToUpper(h)
}
