package idempotency_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// Field lists name top-level fields byte for byte, while encoding/json
// matches names to struct fields ignoring case, with Unicode simple folding,
// and lets the last match win. These specs pin the refusal that keeps the
// fingerprint and the handler reading the same fields.

// createOrderFields is the example's create_order allow-list.
var createOrderFields = []string{"user_id", "sku_id", "quantity", "coupon_id"}

func fingerprintErr(fp idempotency.FingerprintFunc, body string) (string, error) {
	r, b := fpRequest(http.MethodPost, "/orders", "application/json", body)
	return fp(r, b)
}

func TestFingerprint_FieldLists_NamesEqualIgnoringCase_AreInvalidBody(t *testing.T) {
	t.Parallel()
	allow := idempotency.FingerprintConfig{Fields: createOrderFields}
	deny := idempotency.FingerprintConfig{IgnoreFields: []string{"timestamp", "trace_id"}}
	tests := []struct {
		name    string
		cfg     idempotency.FingerprintConfig
		body    string
		message string
	}{
		{
			"case variant of an allowed name beside it", allow,
			`{"user_id":7,"sku_id":20001,"quantity":1,"QUANTITY":50}`,
			`names "quantity" and "QUANTITY" are equal ignoring case; send each field once, spelled exactly`,
		},
		{
			"case variant of an allowed name alone", allow,
			`{"user_id":7,"sku_id":20001,"Quantity":50}`,
			`name "Quantity" is the field "quantity" ignoring case; spell listed fields exactly`,
		},
		{
			"long s beside an allowed name", allow,
			`{"user_id":7,"ſku_id":20002,"sku_id":20001,"quantity":1}`,
			`names "\u017fku_id" and "sku_id" are equal ignoring case`,
		},
		{
			"long s for an allowed name alone", allow,
			`{"user_id":7,"ſku_id":20002,"quantity":1}`,
			`name "\u017fku_id" is the field "sku_id" ignoring case`,
		},
		{
			"Kelvin sign beside an allowed name", allow,
			"{\"user_id\":7,\"sku_id\":20001,\"s\u212au_id\":20002,\"quantity\":1}",
			`names "sku_id" and "s\u212au_id" are equal ignoring case`,
		},
		{
			"escaped Kelvin sign for an allowed name alone", allow,
			`{"user_id":7,"s\u212Au_id":20002,"quantity":1}`,
			`name "s\u212au_id" is the field "sku_id" ignoring case`,
		},
		{
			"escaped upper-case letter beside an allowed name", allow,
			`{"quantity":1,"qu\u0041ntity":50}`,
			`names "quantity" and "quAntity" are equal ignoring case`,
		},
		{
			"escaped upper-case name alone", allow,
			`{"\u0051\u0055ANTITY":50}`,
			`name "QUANTITY" is the field "quantity" ignoring case`,
		},
		{
			"escaped long s beside an allowed name", allow,
			`{"sku_id":20001,"\u017Fku_id":20002}`,
			`names "sku_id" and "\u017fku_id" are equal ignoring case`,
		},
		{
			"two names outside the allow-list", allow,
			`{"user_id":7,"order_no":"a","ORDER_NO":"b"}`,
			`names "order_no" and "ORDER_NO" are equal ignoring case`,
		},
		{
			"two names outside the allow-list by Kelvin sign", allow,
			"{\"kind\":1,\"\u212aind\":2}",
			`names "kind" and "\u212aind" are equal ignoring case`,
		},
		{
			"two non-ASCII names", allow,
			`{"café":1,"CAFÉ":2}`,
			`names "caf\u00e9" and "CAF\u00c9" are equal ignoring case`,
		},
		{
			"case variant of a denied name alone", deny,
			`{"sku":"A","TimeStamp":1}`,
			`name "TimeStamp" is the field "timestamp" ignoring case`,
		},
		{
			"case variant of a denied name beside it", deny,
			`{"sku":"A","trace_id":"x","TRACE_ID":"y"}`,
			`names "trace_id" and "TRACE_ID" are equal ignoring case`,
		},
		{
			"two names outside the deny-list", deny,
			`{"sku":"A","SKU":"B"}`,
			`names "sku" and "SKU" are equal ignoring case`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sum, err := fingerprintErr(idempotency.NewFingerprint(tt.cfg), tt.body)
			require.ErrorIs(t, err, idempotency.ErrInvalidBody)
			require.ErrorContains(t, err, tt.message)
			require.Empty(t, sum)
		})
	}
}

func TestFingerprint_FieldLists_ByteEqualDuplicate_IsStillReportedAsDuplicate(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: createOrderFields})
	_, err := fingerprintErr(fp, `{"quantity":1,"QUANTITY":2,"quantity":3}`)
	require.ErrorIs(t, err, idempotency.ErrInvalidBody)
	require.ErrorContains(t, err, `duplicate key "quantity"`)
}

func TestFingerprint_FieldLists_NamesDistinctIgnoringCase_AreAccepted(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: createOrderFields})
	base := fingerprint(t, fp, http.MethodPost, "/orders", "application/json",
		`{"user_id":7,"sku_id":20001,"quantity":1}`)
	for _, body := range []string{
		`{"user_id":7,"sku_id":20001,"quantity":1,"order_no":"O-1","sku":1,"skus":2}`,
		`{"quantity":1,"sku_id":20001,"user_id":7}`,
		`{"user_id":7,"sku_id":20001,"qu\u0061ntity":1}`, // escaped, but spelled exactly
		`{"user_id":7,"sku_id":20001,"quantity":1,"coupon_id":null}`,
		// Not simple folds of each other: encoding/json keeps them apart.
		`{"user_id":7,"sku_id":20001,"quantity":1,"ı":1,"i":2,"İ":3}`,
		`{"user_id":7,"sku_id":20001,"quantity":1,"straße":1,"STRASSE":2}`,
		// Field lists stop at the top level, so nested objects count whole
		// and their names need no check.
		`{"user_id":7,"sku_id":20001,"quantity":1,"meta":{"a":1,"A":2,"Quantity":3}}`,
	} {
		require.Equal(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", body), "body %s", body)
	}
}

func TestFingerprint_FieldLists_CaseVariantsInNestedObjects_CountWhole(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{"item"}})
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"item":{"qty":1,"QTY":50}}`),
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"item":{"qty":1}}`))
}

func TestFingerprint_FieldLists_ListedNamesEqualIgnoringCase_AreEachAcceptedSpelledExactly(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{"a", "A"}})
	require.NotEqual(t,
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"a":1}`),
		fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"A":1}`))
	_, err := fingerprintErr(fp, `{"a":1,"A":1}`)
	require.ErrorIs(t, err, idempotency.ErrInvalidBody)
}

func TestFingerprint_FieldLists_ManyNamesWithOneFoldedPair_IsInvalidBody(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"trace_id"}})
	var b strings.Builder
	b.WriteString("{")
	for i := range 500 {
		fmt.Fprintf(&b, `"field_%03d":%d,`, 499-i, i)
	}
	ok := b.String() + `"last":0}`
	_, err := fingerprintErr(fp, ok)
	require.NoError(t, err)

	_, err = fingerprintErr(fp, b.String()+`"FIELD_250":0}`)
	require.ErrorIs(t, err, idempotency.ErrInvalidBody)
	require.ErrorContains(t, err, `names "field_250" and "FIELD_250" are equal ignoring case`)
}

func TestFingerprint_FieldLists_CaseVariantAnywhereInALongName_IsInvalidBody(t *testing.T) {
	t.Parallel()
	// Long names are scanned eight bytes at a time: a variant at any
	// position must be found, and the neighbours of 'A'..'Z' and 'a'..'z'
	// must not be taken for letters.
	const name = "abcdefghijklmnopqrstuvwxyz_0123456789"
	allow := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: []string{name}})
	deny := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"trace_id"}})
	for i := range len(name) {
		variants := map[string]bool{"@": false, "[": false, "`": false, "{": false}
		if c := name[i]; 'a' <= c && c <= 'z' {
			variants[strings.ToUpper(name[i:i+1])] = true
		}
		switch name[i] {
		case 's':
			variants["ſ"] = true
		case 'k':
			variants["\u212a"] = true
		}
		for variant, refused := range variants {
			v := name[:i] + variant + name[i+1:]
			_, errAlone := fingerprintErr(allow, `{"`+v+`":1}`)
			_, errPair := fingerprintErr(deny, `{"`+name+`":1,"`+v+`":2}`)
			if refused {
				require.ErrorIs(t, errAlone, idempotency.ErrInvalidBody, "name %s", v)
				require.ErrorIs(t, errPair, idempotency.ErrInvalidBody, "name %s", v)
			} else {
				require.NoError(t, errAlone, "name %s", v)
				require.NoError(t, errPair, "name %s", v)
			}
		}
	}
}

func TestFingerprint_FieldLists_RefuseNamesExactlyWhenBytesEqualFold(t *testing.T) {
	t.Parallel()
	// Every rune with a simple fold, paired with the next rune of its orbit
	// (bytes.EqualFold: refused) and with its successor (usually not equal
	// ignoring case: accepted), so the folding matches encoding/json's.
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{IgnoreFields: []string{"trace_id"}})
	pairs := 0
	for r := rune(0x20); r <= unicode.MaxRune; r++ {
		f := unicode.SimpleFold(r)
		if f == r || !utf8.ValidRune(r) {
			continue
		}
		for _, other := range []rune{f, r + 1} {
			if !utf8.ValidRune(other) {
				continue
			}
			a, b := "_"+string(r), "_"+string(other)
			ka, _ := json.Marshal(a)
			kb, _ := json.Marshal(b)
			_, err := fingerprintErr(fp, fmt.Sprintf(`{%s:1,%s:2}`, ka, kb))
			if bytes.EqualFold([]byte(a), []byte(b)) {
				require.ErrorIs(t, err, idempotency.ErrInvalidBody, "%U and %U", r, other)
				require.ErrorContains(t, err, "equal ignoring case", "%U and %U", r, other)
			} else {
				require.NoError(t, err, "%U and %U", r, other)
			}
			pairs++
		}
	}
	require.Greater(t, pairs, 2000)
}

func TestFingerprint_NoFieldLists_CaseVariantIsADifferentFingerprint(t *testing.T) {
	t.Parallel()
	// Without field lists the whole body counts, so a case variant cannot
	// hide: it changes the fingerprint and needs no refusal.
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{})
	exact := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"quantity":1}`)
	for _, body := range []string{
		`{"quantity":1,"QUANTITY":50}`,
		`{"QUANTITY":1}`,
		`{"quantity":1,"ſku_id":2}`,
	} {
		require.NotEqual(t, exact, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", body), "body %s", body)
	}
}

func TestFingerprint_AllowList_NumberSpellingsOfOneValue_ShareAFingerprint(t *testing.T) {
	t.Parallel()
	// Numbers compare by value. That is safe because encoding/json decodes
	// only integer spellings into integer types: a 1.0 that shares the
	// fingerprint of 1 is a decode error, never a different quantity.
	fp := idempotency.NewFingerprint(idempotency.FingerprintConfig{Fields: createOrderFields})
	base := fingerprint(t, fp, http.MethodPost, "/orders", "application/json", `{"quantity":1}`)
	for _, q := range []string{`1.0`, `1e0`, `10e-1`, `0.1e1`, `1E+0`} {
		body := `{"quantity":` + q + `}`
		require.Equal(t, base, fingerprint(t, fp, http.MethodPost, "/orders", "application/json", body), "body %s", body)
		var req struct {
			Quantity int `json:"quantity"`
		}
		require.Error(t, json.Unmarshal([]byte(body), &req), "body %s", body)
	}
	var f1, f2 struct {
		Price float64 `json:"price"`
	}
	require.NoError(t, json.Unmarshal([]byte(`{"price":0.1}`), &f1))
	require.NoError(t, json.Unmarshal([]byte(`{"price":1e-1}`), &f2))
	require.Equal(t, f1, f2)
}
