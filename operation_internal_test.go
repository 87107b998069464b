package idempotency

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The operation's fingerprint over HTTP (the path, the body) and over a
// transport without URLs (one JSON object) must agree for the same
// business request, and differ for any other.

func mustOperation(t *testing.T, op Operation) *operation {
	t.Helper()
	o, err := newOperation(op)
	require.NoError(t, err)
	return o
}

func httpFingerprint(t *testing.T, o *operation, method, target, contentType, body string) (string, error) {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return o.fingerprintRequest(r, []byte(body))
}

func TestOperation_HTTPAndJSON_SameRequest_SameFingerprint(t *testing.T) {
	create := mustOperation(t, Operation{Name: "create_order", Route: "POST /orders",
		Fields: []string{"user_id", "sku_id", "quantity", "coupon_id"}, Status: 201})
	cancel := mustOperation(t, Operation{Name: "cancel_order", Route: "POST /orders/{order_no}/cancel"})
	byID := mustOperation(t, Operation{Route: "POST /users/{user_id}/orders/{order_no}/refund", IgnoreFields: []string{"trace_id"}})

	tests := []struct {
		name     string
		op       *operation
		target   string
		ct, body string
		params   string
	}{
		{"create: listed fields, any order, others ignored", create, "/orders", "application/json",
			`{"user_id":7,"sku_id":1,"quantity":2,"order_no":"mine"}`,
			`{"quantity":2,"sku_id":1,"user_id":7,"coupon_id":null}`},
		{"cancel: no body is the path parameter alone", cancel, "/orders/ORD-1/cancel", "", "",
			`{"order_no":"ORD-1"}`},
		{"cancel: an empty object is no body", cancel, "/orders/ORD-1/cancel", "application/json", `{}`,
			`{"order_no":"ORD-1"}`},
		{"cancel: a body member named as the parameter counts once, in the path", cancel, "/orders/ORD-1/cancel",
			"application/json", `{"order_no":"ORD-1"}`, `{"order_no":"ORD-1"}`},
		{"cancel: an empty payload is the empty object", cancel, "/orders//cancel", "", "", ``},
		{"an escaped segment is its value", cancel, "/orders/A%20B/cancel", "", "", `{"order_no":"A B"}`},
		{"a number parameter is its canonical text", byID, "/users/7/orders/X/refund", "application/json",
			`{"amount":100,"trace_id":"t1"}`, `{"user_id":7.0,"order_no":"X","amount":1e2,"trace_id":"t2"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			overHTTP, err := httpFingerprint(t, tt.op, "POST", tt.target, tt.ct, tt.body)
			require.NoError(t, err)
			overJSON, err := tt.op.fingerprintJSON([]byte(tt.params))
			require.NoError(t, err)
			require.Equal(t, overHTTP, overJSON)
		})
	}
}

func TestOperation_DifferentRequests_DifferentFingerprints(t *testing.T) {
	cancel := mustOperation(t, Operation{Route: "POST /orders/{order_no}/cancel"})
	pay := mustOperation(t, Operation{Route: "POST /orders/{order_no}/pay"})
	create := mustOperation(t, Operation{Route: "POST /orders", Fields: []string{"sku_id", "quantity"}})

	fp := func(o *operation, params string) string {
		t.Helper()
		s, err := o.fingerprintJSON([]byte(params))
		require.NoError(t, err)
		return s
	}
	seen := map[string]string{}
	for name, got := range map[string]string{
		"cancel A":            fp(cancel, `{"order_no":"A"}`),
		"cancel B":            fp(cancel, `{"order_no":"B"}`),
		"cancel A, reason":    fp(cancel, `{"order_no":"A","reason":"late"}`),
		"pay A":               fp(pay, `{"order_no":"A"}`),
		"create 1×2":          fp(create, `{"sku_id":1,"quantity":2}`),
		"create 1×3":          fp(create, `{"sku_id":1,"quantity":3}`),
		"cancel, no order_no": fp(cancel, `{}`),
	} {
		if other, dup := seen[got]; dup {
			t.Fatalf("%s and %s share a fingerprint", name, other)
		}
		seen[got] = name
	}

	// A path the route does not fit is fingerprinted as itself, never as
	// a request the route fits.
	mounted, err := httpFingerprint(t, cancel, "POST", "/orders/A/cancel/", "", "")
	require.NoError(t, err)
	require.NotEqual(t, fp(cancel, `{"order_no":"A"}`), mounted)
	// The query counts over HTTP.
	withQuery, err := httpFingerprint(t, cancel, "POST", "/orders/A/cancel?force=1", "", "")
	require.NoError(t, err)
	require.NotEqual(t, fp(cancel, `{"order_no":"A"}`), withQuery)
}

func TestOperation_BadParameters_Refused(t *testing.T) {
	cancel := mustOperation(t, Operation{Route: "POST /orders/{order_no}/cancel"})
	_, err := httpFingerprint(t, cancel, "POST", "/orders/A/cancel", "text/plain", "hello")
	require.ErrorIs(t, err, ErrUnsupportedMediaType)
	_, err = httpFingerprint(t, cancel, "POST", "/orders/A/cancel", "application/json", `[1]`)
	require.ErrorIs(t, err, ErrInvalidBody)
	_, err = cancel.fingerprintJSON([]byte(`{"order_no":{"nested":1}}`))
	require.ErrorIs(t, err, ErrInvalidBody)
	_, err = cancel.fingerprintJSON([]byte(`not json`))
	require.ErrorIs(t, err, ErrInvalidBody)
	// A body that names another order than the path is two actions.
	_, err = httpFingerprint(t, cancel, "POST", "/orders/A/cancel", "application/json", `{"order_no":"B"}`)
	require.ErrorIs(t, err, ErrInvalidBody)
	// Names that encoding/json reads alike are refused, as field lists
	// refuse them.
	_, err = cancel.fingerprintJSON([]byte(`{"order_no":"A","reason":"x","REASON":"y"}`))
	require.ErrorIs(t, err, ErrInvalidBody)
}

func TestOperation_BadDeclaration_RefusedAtNew(t *testing.T) {
	for _, op := range []Operation{
		{Route: ""},
		{Route: "/orders"},
		{Route: "POST orders"},
		{Route: "POST /orders/{}/cancel"},
		{Route: "POST /orders/x{order_no}/cancel"},
		{Route: "POST /orders/{order_no/cancel"},
		{Route: "POST /a/{id}/b/{id}"},
		{Route: "POST /orders?x=1"},
		{Route: "POST /orders", Status: 404},
		{Route: "post /orders"},
	} {
		_, err := newOperation(op)
		require.Error(t, err, "%+v", op)
	}
}

func TestConfig_Operation_DeclaresTheFingerprintAlone(t *testing.T) {
	store := NewMySQLStore(nil)
	op := &Operation{Name: "cancel_order", Route: "POST /orders/{order_no}/cancel"}

	m, err := New(store, &Config{Operation: op})
	require.NoError(t, err)
	require.Equal(t, "cancel_order", m.Config().Route, "the route's label defaults to the operation's name")
	overJSON, err := m.FingerprintJSON([]byte(`{"order_no":"A"}`))
	require.NoError(t, err)
	overHTTP, err := m.fingerprint(httptest.NewRequest("POST", "/orders/A/cancel", nil), nil)
	require.NoError(t, err)
	require.Equal(t, overHTTP, overJSON, "the Handler fingerprints by the operation")

	for _, cfg := range []Config{
		{Operation: op, Fingerprint: FingerprintConfig{Fields: []string{"x"}}},
		{Operation: op, FingerprintFunc: NewFingerprint(FingerprintConfig{})},
		{Operation: &Operation{Route: "orders"}},
	} {
		_, err := New(store, &cfg)
		require.Error(t, err)
	}

	plain, err := New(store, nil)
	require.NoError(t, err)
	_, err = plain.FingerprintJSON([]byte(`{}`))
	require.Error(t, err, "no operation, no operation fingerprint")
}
