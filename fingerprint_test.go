package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func canonical(t testing.TB, in string) string {
	t.Helper()
	out, err := idempotency.CanonicalJSON([]byte(in))
	require.NoError(t, err, "input %q", in)
	return string(out)
}

func TestCanonicalJSON_WritesOneForm(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"a\" : [ 1 , 2 ] ,\r\n\"b\":{ } } ", `{"a":[1,2],"b":{}}`},
		{`[]`, `[]`},
		{`"x"`, `"x"`},
		{`true`, `true`},
		{`false`, `false`},
		{`null`, `null`},
		{`0`, `0`},
		{`-0`, `0`},
		{`-0.0e-5`, `0`},
		{`0e99999999999999999999`, `0`},
		{`1.5`, `15e-1`},
		{`100`, `1e2`},
		{`0.0`, `0`},
		{`-12.340`, `-1234e-2`},
		{`0.00120`, `12e-4`},
		{`1E+2`, `1e2`},
		{`12345678901234567890`, `1234567890123456789e1`},
		{`"\u00e9\u00E9é"`, `"ééé"`},
		{`"\/\"\\"`, `"/\"\\"`},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u0000\u001F\u0008"`, `"\u0000\u001f\b"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\u2028<>&"`, "\"\u2028<>&\""},
		{`{"é":1,"e":2,"z":3,"\u0000":4}`, `{"\u0000":4,"e":2,"z":3,"é":1}`},
		{`{"b":{"d":1,"c":[{"f":1,"e":2}]},"a":null}`, `{"a":null,"b":{"c":[{"e":2,"f":1}],"d":1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, canonical(t, tt.in))
		})
	}
}

func TestCanonicalJSON_KeyOrderAndWhitespace_DoNotMatter(t *testing.T) {
	t.Parallel()
	a := canonical(t, `{"id":"o-1","items":[{"sku":"A","qty":2},{"sku":"B","qty":1}],"total":{"amount":"12.50","currency":"EUR"}}`)
	b := canonical(t, `{
		"total": {"currency": "EUR", "amount": "12.50"},
		"items": [ {"qty": 2, "sku": "A"}, {"qty": 1, "sku": "B"} ],
		"id": "o-1"
	}`)
	require.Equal(t, a, b)
}

func TestCanonicalJSON_EquivalentSpellings_AreEqual(t *testing.T) {
	t.Parallel()
	groups := [][]string{
		{`1`, `1.0`, `1e0`, `10e-1`, `0.1e1`, `1.000E+0`, `100e-2`, `0.001e3`},
		{`0`, `-0`, `0.0`, `-0.0`, `0e10`, `0E-10`, `-0e+0`},
		{`-2.5`, `-25e-1`, `-0.25e1`, `-250E-2`},
		{`1e999999999`, `10e999999998`, `0.1e1000000000`},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
		{`"/"`, `"\/"`, `"\u002f"`},
		{`"\n"`, `"\u000a"`, `"\u000A"`},
		{`"😀"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`},
		{`{"a":1,"b":[1,{"c":2,"d":3}]}`, `{"b":[1.0,{"d":3,"c":2}],"a":1e0}`, `{"\u0062":[1,{"d":3,"\u0063":2}],"a":1}`},
	}
	for _, g := range groups {
		t.Run(g[0], func(t *testing.T) {
			t.Parallel()
			want := canonical(t, g[0])
			for _, in := range g[1:] {
				require.Equal(t, want, canonical(t, in), "input %q", in)
			}
		})
	}
}

func TestCanonicalJSON_DifferentValues_Differ(t *testing.T) {
	t.Parallel()
	pairs := [][2]string{
		{`1`, `2`},
		{`1`, `-1`},
		{`12345678901234567890`, `12345678901234567891`},
		{`0.1`, `0.10000000000000001`},
		{`1e400`, `1e401`},
		{`1`, `"1"`},
		{`true`, `"true"`},
		{`null`, `0`},
		{`[]`, `{}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`{"a":{"b":1}}`, `{"a.b":1}`},
		{`"a"`, `"A"`},
		{`"e\u0301"`, `"é"`}, // no Unicode normalisation: bytes differ
	}
	for _, p := range pairs {
		t.Run(p[0]+" vs "+p[1], func(t *testing.T) {
			t.Parallel()
			require.NotEqual(t, canonical(t, p[0]), canonical(t, p[1]))
		})
	}
}

func TestCanonicalJSON_RejectsMalformedAndAmbiguousJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, message string
	}{
		{"duplicate key", `{"a":1,"a":1}`, `duplicate key "a"`},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`, `duplicate key "a"`},
		{"duplicate key nested", `[{"x":{"k":1,"j":0,"k":2}}]`, `duplicate key "k"`},
		{"trailing garbage", `{"a":1} x`, "data after the JSON value"},
		{"two values", `1 2`, "data after the JSON value"},
		{"trailing comma in object", `{"a":1,}`, "expected a string key"},
		{"trailing comma in array", `[1,]`, "invalid character"},
		{"invalid UTF-8 in string", "\"\xff\"", "not valid UTF-8"},
		{"invalid UTF-8 in key", "{\"\xc3\":1}", "not valid UTF-8"},
		{"invalid UTF-8 outside strings", "[1]\xff", "not valid UTF-8"},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", "not valid UTF-8"},
		{"byte order mark", "\xef\xbb\xbf{}", "invalid character"},
		{"lone high surrogate", `"\ud800"`, "unpaired surrogate"},
		{"lone low surrogate", `"\udc00x"`, "unpaired surrogate"},
		{"high surrogate then non-surrogate", `"\ud800\u0041"`, "unpaired surrogate"},
		{"bad unicode escape", `"\u12g4"`, "invalid \\u escape"},
		{"short unicode escape", `"\u12"`, "invalid \\u escape"},
		{"bad escape", `"\x41"`, "invalid escape"},
		{"raw control character", "\"a\tb\"", "control character"},
		{"unterminated string", `"abc`, "unexpected end"},
		{"unterminated object", `{"a":1`, "unexpected end"},
		{"unterminated array", `[1`, "unexpected end"},
		{"missing colon", `{"a" 1}`, "expected ':'"},
		{"unquoted key", `{a:1}`, "expected a string key"},
		{"single quotes", `'a'`, "invalid character"},
		{"leading zero", `01`, "data after the JSON value"},
		{"leading plus", `+1`, "invalid character"},
		{"bare fraction", `.5`, "invalid character"},
		{"empty fraction", `[1.]`, "invalid number"},
		{"empty exponent", `1e`, "unexpected end"},
		{"lone minus", `-`, "unexpected end"},
		{"minus letter", `-a`, "invalid number"},
		{"NaN", `NaN`, "invalid character"},
		{"Infinity", `Infinity`, "invalid character"},
		{"truncated literal", `tru`, "invalid literal"},
		{"comment", `{} // x`, "data after the JSON value"},
		{"empty", ``, "unexpected end"},
		{"only whitespace", " \n\t", "unexpected end"},
		{"exponent too large", `1e1000000001`, "exponent out of range"},
		{"exponent too small", `1e-1000000001`, "exponent out of range"},
		{"exponent overflows int64", `1e99999999999999999999999`, "exponent out of range"},
		{"digits push exponent out of range", `10e1000000000`, "exponent out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := idempotency.CanonicalJSON([]byte(tt.in))
			require.ErrorIs(t, err, idempotency.ErrInvalidBody)
			require.ErrorContains(t, err, tt.message)
			require.Nil(t, out)
		})
	}
}

func TestCanonicalJSON_NestingBeyond10000_IsRejected(t *testing.T) {
	t.Parallel()
	deep := func(n int) []byte {
		return []byte(strings.Repeat(`[{"a":`, n/2) + strings.Repeat(`[`, n%2) + "1" +
			strings.Repeat(`]`, n%2) + strings.Repeat(`}]`, n/2))
	}
	out, err := idempotency.CanonicalJSON(deep(10000))
	require.NoError(t, err)
	require.True(t, json.Valid(out))

	_, err = idempotency.CanonicalJSON(deep(10001))
	require.ErrorIs(t, err, idempotency.ErrInvalidBody)
	require.ErrorContains(t, err, "nesting deeper than 10000")
}

func TestCanonicalJSON_DoesNotModifyItsInput(t *testing.T) {
	t.Parallel()
	in := []byte(`{"b":"\u00e9","a":[1.0]}`)
	orig := bytes.Clone(in)
	_, err := idempotency.CanonicalJSON(in)
	require.NoError(t, err)
	require.Equal(t, orig, in)
}

// fpRequest builds a request; an empty contentType sends none.
func fpRequest(method, target, contentType, body string) (*http.Request, []byte) {
	r := httptest.NewRequest(method, target, nil)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r, []byte(body)
}

func fingerprint(t testing.TB, fp idempotency.FingerprintFunc, method, target, contentType, body string) string {
	t.Helper()
	r, b := fpRequest(method, target, contentType, body)
	sum, err := fp(r, b)
	require.NoError(t, err)
	return sum
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

func TestFingerprint_Is64LowercaseHexOfTheLengthPrefixedTuple(t *testing.T) {
	t.Parallel()
	// Stored fingerprints must stay comparable across releases: this pins
	// the encoding, so changing it means changing the version tag.
	frame := func(b []byte, s string) []byte {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		return append(b, s...)
	}
	hash := func(parts ...string) string {
		var in []byte
		for _, p := range parts {
			in = frame(in, p)
		}
		sum := sha256.Sum256(in)
		return hex.EncodeToString(sum[:])
	}
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})

	got := fingerprint(t, fp, http.MethodPost, "/orders?b=2&a=1", "application/json", `{ "b":1.0, "a":"x" }`)
	require.Regexp(t, hex64, got)
	require.Equal(t, hash("orderguard-fp-v1", "POST", "/orders?a=1&b=2", "json", `{"a":"x","b":1}`), got)

	got = fingerprint(t, fp, http.MethodPut, "/notes/1", "text/plain", "hello ")
	require.Regexp(t, hex64, got)
	require.Equal(t, hash("orderguard-fp-v1", "PUT", "/notes/1", "raw", "hello "), got)
}

func TestFingerprint_KeyOrderAndWhitespace_DoNotMatter(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	a := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"sku":"A","qty":2,"price":1.50}`)
	b := fingerprint(t, fp, http.MethodPost, "/orders", "application/json; charset=utf-8", "{\n  \"price\": 15e-1,\n  \"qty\": 2,\n  \"sku\": \"\\u0041\"\n}\n")
	require.Equal(t, a, b)
}

func TestFingerprint_MethodRouteAndBody_AllCount(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	base := fingerprint(t, fp, http.MethodPost, "/orders?a=1&b=2", "application/json", `{"qty":1}`)
	tests := []struct {
		name, method, target, body string
	}{
		{"method", http.MethodPut, "/orders?a=1&b=2", `{"qty":1}`},
		{"path", http.MethodPost, "/orders/", `{"qty":1}`},
		{"path case", http.MethodPost, "/Orders?a=1&b=2", `{"qty":1}`},
		{"query value", http.MethodPost, "/orders?a=1&b=3", `{"qty":1}`},
		{"query name", http.MethodPost, "/orders?a=1&c=2", `{"qty":1}`},
		{"extra query parameter", http.MethodPost, "/orders?a=1&b=2&b=2", `{"qty":1}`},
		{"missing query", http.MethodPost, "/orders", `{"qty":1}`},
		{"body value", http.MethodPost, "/orders?a=1&b=2", `{"qty":2}`},
		{"body field", http.MethodPost, "/orders?a=1&b=2", `{"qty":1,"note":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.NotEqual(t, base, fingerprint(t, fp, tt.method, tt.target, "application/json", tt.body))
		})
	}
}

func TestFingerprint_QueryNameOrder_DoesNotMatter(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	a := fingerprint(t, fp, http.MethodPost, "/orders?a=1&b=2", "", "")
	b := fingerprint(t, fp, http.MethodPost, "/orders?b=2&a=1", "", "")
	require.Equal(t, a, b)
	require.NotEqual(t, a, fingerprint(t, fp, http.MethodPost, "/orders?a=2&b=1", "", ""))
}

func TestFingerprint_RepeatedQueryName_ValueOrderCounts(t *testing.T) {
	t.Parallel()
	// r.URL.Query().Get("sku") is the first value sent, so the handler
	// sees sku 1 in the first request and sku 2 in the second.
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/orders?sku=1&sku=2", "", ""),
		fingerprint(t, fp, http.MethodPost, "/orders?sku=2&sku=1", "", ""))
	require.Equal(t,
		fingerprint(t, fp, http.MethodPost, "/orders?sku=1&a=0&sku=2", "", ""),
		fingerprint(t, fp, http.MethodPost, "/orders?a=0&sku=1&sku=2", "", ""))
}

func TestCanonicalRoute_SortsQueryNamesKeepsValueOrderAndEscapesOneWay(t *testing.T) {
	t.Parallel()
	tests := []struct{ target, want string }{
		{"/orders", "/orders"},
		{"/orders?", "/orders"},
		{"/orders?&&", "/orders"},
		{"/orders?b=2&a=1", "/orders?a=1&b=2"},
		{"/orders?a=2&b=0&a=1", "/orders?a=2&a=1&b=0"},
		{"/orders?sku=2&sku=1", "/orders?sku=2&sku=1"},
		{"/orders?sku=1&sku=2", "/orders?sku=1&sku=2"},
		{"/orders?b=&a=3&b=x&a=1&a=2", "/orders?a=3&a=1&a=2&b=&b=x"},
		{"/orders?a", "/orders?a="},
		{"/orders?q=a+b", "/orders?q=a+b"},
		{"/orders?q=a%20b", "/orders?q=a+b"},
		{"/orders?q=%2f%3F", "/orders?q=%2F%3F"},
		{"/orders?q=%C3%A9", "/orders?q=%C3%A9"},
		{"/%61bc", "/abc"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/a%2Fb", "/a%2Fb"},
		{"/a%2fb/c%20d", "/a%2Fb/c%20d"},
		{"/a/b", "/a/b"},
		{"/orders?a=%zz", "/orders?a=%zz"},
		{"/orders?a=1;b=2", "/orders?a=1;b=2"},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, tt.target, nil)
			require.Equal(t, tt.want, idempotency.CanonicalRoute(r))
		})
	}
}

func TestFingerprint_AllowList_IgnoresOtherFieldsAndAbsentEqualsNull(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{"a", "b"}})
	base := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1}`)
	for _, body := range []string{
		`{"a":1,"b":null}`,
		`{"b":null,"a":1.0}`,
		`{"a":1,"c":"ignored"}`,
		`{"a":1,"c":{"deep":[1,2]},"trace_id":"t-9"}`,
		`{"\u0061":1}`,
	} {
		require.Equal(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", body), "body %s", body)
	}
	for _, body := range []string{
		`{"a":2}`,
		`{"a":1,"b":0}`,
		`{"a":1,"b":false}`,
		`{"a":1,"b":[null]}`,
		`{"a":null}`,
		`{}`,
	} {
		require.NotEqual(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", body), "body %s", body)
	}
	// Ignored fields must still be valid JSON and unambiguous.
	r, b := fpRequest(http.MethodPost, "/orders", "application/json", `{"a":1,"c":1,"c":2}`)
	_, err := fp(r, b)
	require.ErrorIs(t, err, idempotency.ErrInvalidBody)
}

func TestFingerprint_DenyList_DropsFields(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"timestamp", "trace_id"}})
	base := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"sku":"A","timestamp":1}`)
	require.Equal(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json",
		`{"trace_id":"x","sku":"A","timestamp":"2026-01-01T00:00:00Z"}`))
	require.Equal(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"sku":"A"}`))
	require.NotEqual(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"sku":"B","timestamp":1}`))
	// Only the listed fields go; null is a value outside an allow-list.
	require.NotEqual(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"sku":"A","note":null}`))
	// Only top-level fields are dropped.
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"o":{"timestamp":1}}`),
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"o":{"timestamp":2}}`))
}

func TestFingerprint_DenyListWinsOverAllowList(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{"a", "ts"}, IgnoreFields: []string{"ts"}})
	require.Equal(t,
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1,"ts":1}`),
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1,"ts":2}`))
}

func TestFingerprint_FieldLists_NeedAJSONObjectBody(t *testing.T) {
	t.Parallel()
	configs := map[string]idempotency.FingerprintConfig{
		"allow-list": {Fields: []string{"a"}},
		"deny-list":  {IgnoreFields: []string{"a"}},
	}
	tests := []struct {
		name, contentType, body string
		want                    error
	}{
		{"text/plain", "text/plain", `{"a":1}`, idempotency.ErrUnsupportedMediaType},
		{"no content type", "", `{"a":1}`, idempotency.ErrUnsupportedMediaType},
		{"no content type and empty body", "", "", idempotency.ErrUnsupportedMediaType},
		{"form", "application/x-www-form-urlencoded", "a=1", idempotency.ErrUnsupportedMediaType},
		{"malformed content type", "application/json;;", `{"a":1}`, idempotency.ErrUnsupportedMediaType},
		{"json suffix without application", "text/x+json", `{"a":1}`, idempotency.ErrUnsupportedMediaType},
		{"json with empty body", "application/json", "", idempotency.ErrInvalidBody},
		{"json array", "application/json", `[{"a":1}]`, idempotency.ErrInvalidBody},
		{"json scalar", "application/json", `1`, idempotency.ErrInvalidBody},
		{"invalid json", "application/json", `{"a":}`, idempotency.ErrInvalidBody},
	}
	for cname, cfg := range configs {
		fp := idempotency.NewFingerprint(cfg)
		for _, tt := range tests {
			t.Run(cname+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				r, b := fpRequest(http.MethodPost, "/orders", tt.contentType, tt.body)
				sum, err := fp(r, b)
				require.ErrorIs(t, err, tt.want)
				require.Empty(t, sum)
			})
		}
	}
}

func TestFingerprint_JSONMediaTypes_AreCanonicalised(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	want := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1,"b":2}`)
	for _, ct := range []string{
		"application/json; charset=utf-8",
		"Application/JSON",
		"application/json ; charset=\"UTF-8\"",
		"application/merge-patch+json",
		"application/problem+json; charset=utf-8",
	} {
		require.Equal(t, want, fingerprint(t, fp, http.MethodPost, "/orders", ct, `{ "b":2, "a":1.0 }`), "Content-Type %q", ct)
	}
}

func TestFingerprint_InvalidJSONBody_IsErrInvalidBody(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	for _, body := range []string{``, `{`, `{"a":1,"a":2}`, "\"\xff\"", `{} {}`} {
		r, b := fpRequest(http.MethodPost, "/orders", "application/json", body)
		sum, err := fp(r, b)
		require.ErrorIs(t, err, idempotency.ErrInvalidBody, "body %q", body)
		require.Empty(t, sum)
	}
}

func TestFingerprint_NonJSONBody_IsHashedAsRawBytes(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	a := fingerprint(t, fp, http.MethodPost, "/notes", "text/plain", `{"a":1}`)
	require.Equal(t, a, fingerprint(t, fp, http.MethodPost, "/notes", "text/plain; charset=utf-8", `{"a":1}`))
	require.NotEqual(t, a, fingerprint(t, fp, http.MethodPost, "/notes", "text/plain", `{ "a":1}`))
	// Invalid JSON and invalid UTF-8 are fine as raw bytes.
	require.Regexp(t, hex64, fingerprint(t, fp, http.MethodPost, "/notes", "text/plain", "{\xff"))
	// An empty body without a content type is an empty raw body.
	empty := fingerprint(t, fp, http.MethodPost, "/notes", "", "")
	require.Regexp(t, hex64, empty)
	require.NotEqual(t, empty, fingerprint(t, fp, http.MethodPost, "/notes", "", " "))
}

func TestFingerprint_RawBody_NeverEqualsJSONBody(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	// The raw body is byte-for-byte the JSON body's canonical form.
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1}`),
		fingerprint(t, fp, http.MethodPost, "/orders", "text/plain", `{"a":1}`))
}

func TestFingerprint_BytesCannotMoveBetweenComponents(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/a", "text/plain", "b/c"),
		fingerprint(t, fp, http.MethodPost, "/ab", "text/plain", "/c"))
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/a", "text/plain", "/b"),
		fingerprint(t, fp, http.MethodPost, "/a/b", "text/plain", ""))

	// A route function may return anything, so try the method boundary too.
	routeHeader := idempotency.NewFingerprint(idempotency.FingerprintConfig{
		RouteFunc: func(r *http.Request) string { return r.Header.Get("X-Route") },
	})
	withRoute := func(method, route, body string) string {
		r, b := fpRequest(method, "/ignored", "text/plain", body)
		r.Header.Set("X-Route", route)
		sum, err := routeHeader(r, b)
		require.NoError(t, err)
		return sum
	}
	require.NotEqual(t, withRoute("POST", "x", ""), withRoute("POS", "Tx", ""))
	require.NotEqual(t, withRoute("POST", "xjson", ""), withRoute("POST", "x", "json"))
	require.NotEqual(t, withRoute("POST", "", "x"), withRoute("POST", "x", ""))
}

func TestFingerprint_RouteFunc_ReplacesTheRoute(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{
		RouteFunc: func(*http.Request) string { return "/orders/{id}" },
	})
	require.Equal(t,
		fingerprint(t, fp, http.MethodPost, "/orders/1?x=1", "application/json", `{}`),
		fingerprint(t, fp, http.MethodPost, "/orders/2", "application/json", `{}`))
}

func TestFingerprint_ConcurrentUse_GivesStableResults(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"trace_id"}})
	bodies := []string{orderBody, `{"b":[1,{"d":2,"c":1}],"a":"x"}`, `{"trace_id":1}`}
	want := make([]string, len(bodies))
	for i, b := range bodies {
		want[i] = fingerprint(t, fp, http.MethodPost, "/orders?b=1&a=2", "application/json", b)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(bodies)
				r, b := fpRequest(http.MethodPost, "/orders?a=2&b=1", "application/json", bodies[k])
				sum, err := fp(r, b)
				if err != nil || sum != want[k] {
					t.Errorf("body %d: got %q, %v; want %q", k, sum, err, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
}

// reencode writes v, decoded with UseNumber, as different but equivalent
// JSON: keys in reverse order, every non-ASCII or special character as a \u
// escape, and numbers with a redundant fraction and exponent.
func reencode(b *strings.Builder, v any) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		b.WriteString("{ ")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(" ,\n")
			}
			reencodeString(b, k)
			b.WriteString(" : ")
			reencode(b, v[k])
		}
		b.WriteString(" }")
	case []any:
		b.WriteString("[ ")
		for i, e := range v {
			if i > 0 {
				b.WriteString(" , ")
			}
			reencode(b, e)
		}
		b.WriteString(" ]")
	case string:
		reencodeString(b, v)
	case json.Number:
		s := v.String()
		switch {
		case strings.ContainsAny(s, "eE"):
			b.WriteString(s)
		case strings.Contains(s, "."):
			b.WriteString(s + "00e0")
		default:
			b.WriteString(s + ".000E+0")
		}
	default: // bool, nil
		out, _ := json.Marshal(v)
		b.Write(out)
	}
}

func reencodeString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r >= 0x20 && r < 0x7f && r != '"' && r != '\\' && r != '/':
			b.WriteRune(r)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04X\u%04x`, hi, lo)
		default:
			fmt.Fprintf(b, `\u%04X`, r)
		}
	}
	b.WriteByte('"')
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `""`, `0`, `-0`, `1.0`, `1e0`, `10e-1`, `0.1e1`, `12345678901234567890`,
		`1e999999999`, `1e1000000001`, `0e99999999999999999999999`, `-1.5E+3`, `null`, `true`,
		`{"b":1,"a":2}`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"a":[1,{"c":null,"b":"x"}]}`,
		`"\u00e9é\n\u0000\ud83d\ude00"`, `"\ud800"`, `"\/"`, "\"\xff\"", `{"a":1} x`,
		`[[[[[[]]]]]]`, ` { "z" : { "y" : [ 1 , 2.50 , -0.0 ] } } `, `{"\"":"\\","":""}`,
		orderBody,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := idempotency.CanonicalJSON(in)
		if err != nil {
			require.ErrorIs(t, err, idempotency.ErrInvalidBody)
			return
		}
		// Never more lenient than the standard library.
		require.True(t, json.Valid(in), "accepted invalid JSON %q", in)
		require.True(t, json.Valid(out), "produced invalid JSON %q", out)

		again, err := idempotency.CanonicalJSON(out)
		require.NoError(t, err)
		require.Equal(t, string(out), string(again), "not idempotent")

		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		var v any
		require.NoError(t, dec.Decode(&v))

		// encoding/json: sorted keys, its own string escaping (<, >, & ...).
		std, err := json.Marshal(v)
		require.NoError(t, err)
		fromStd, err := idempotency.CanonicalJSON(std)
		require.NoError(t, err)
		require.Equal(t, string(out), string(fromStd), "encoding/json form %q", std)

		// Reversed keys, escaped strings, respelled numbers.
		var sb strings.Builder
		reencode(&sb, v)
		fromRe, err := idempotency.CanonicalJSON([]byte(sb.String()))
		require.NoError(t, err, "re-encoded %q", sb.String())
		require.Equal(t, string(out), string(fromRe), "re-encoded %q", sb.String())
	})
}

// orderBody is a realistic order of about 1 KiB.
var orderBody = func() string {
	var b strings.Builder
	b.WriteString(`{"customer_id":"cus_8f14e45fceea167a5a36dedd4bea2543","currency":"EUR",` +
		`"shipping":{"name":"Ada Lovelace","street":"12 Analytical Engine Way","city":"London",` +
		`"postal_code":"NW1 6XE","country":"GB"},"items":[`)
	for i := range 8 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"SKU-` + strconv.Itoa(1000+i) + `","name":"Widget Größe ` + strconv.Itoa(i) +
			`","quantity":` + strconv.Itoa(i+1) + `,"unit_price":"19.99","discount":0.15}`)
	}
	b.WriteString(`],"notes":"Leave at the door.\nRing twice.","timestamp":"2026-01-02T03:04:05Z",` +
		`"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","total":{"amount":"123.45","tax":"20.58"}}`)
	return b.String()
}()

func BenchmarkFingerprint_OrderBody(b *testing.B) {
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"timestamp", "trace_id"}})
	r, body := fpRequest(http.MethodPost, "/v1/orders", "application/json", orderBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fp(r, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint_OrderBody_WholeBody(b *testing.B) {
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	r, body := fpRequest(http.MethodPost, "/v1/orders", "application/json", orderBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fp(r, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint_CreateOrder_AllowList(b *testing.B) {
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{"user_id", "sku_id", "quantity", "coupon_id"}})
	r, body := fpRequest(http.MethodPost, "/orders", "application/json",
		`{"user_id":7,"sku_id":20001,"quantity":2,"coupon_id":17,"order_no":"O2026010203ab"}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fp(r, body); err != nil {
			b.Fatal(err)
		}
	}
}
