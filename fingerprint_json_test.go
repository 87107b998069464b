package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// One action is one fingerprint whatever carries it: a front-end without
// HTTP that names the HTTP route of the same action gets, for the same
// business fields, the fingerprint the HTTP route computes, whatever the
// fields' order, spelling of numbers or fields outside the list.
func TestJSONFingerprint_SameActionAsHTTP_SameFingerprint(t *testing.T) {
	t.Parallel()
	cfg := idempotency.FingerprintConfig{Fields: []string{"user_id", "sku_id", "quantity", "coupon_id"}}
	overHTTP := func(body string) string {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		fp, err := idempotency.NewFingerprint(cfg)(r, []byte(body))
		require.NoError(t, err)
		return fp
	}
	jsonFP := idempotency.NewJSONFingerprint(cfg)
	elsewhere := func(method, route, body string) string {
		fp, err := jsonFP(method, route, []byte(body))
		require.NoError(t, err)
		return fp
	}

	viaHTTP := overHTTP(`{"user_id":7,"sku_id":20001,"quantity":1,"coupon_id":11}`)
	require.Equal(t, viaHTTP, elsewhere("POST", "/orders", `{"coupon_id":11,"quantity":1.0,"sku_id":20001,"user_id":7,"order_no":"X-1"}`))
	require.NotEqual(t, viaHTTP, elsewhere("POST", "/orders", `{"user_id":7,"sku_id":20001,"quantity":2,"coupon_id":11}`),
		"other business fields are another action")
	require.NotEqual(t, viaHTTP, elsewhere("POST", "/carts", `{"user_id":7,"sku_id":20001,"quantity":1,"coupon_id":11}`),
		"another route is another action")
	require.Equal(t, overHTTP(`{"user_id":7,"sku_id":1,"quantity":1}`), elsewhere("POST", "/orders", `{"user_id":7,"sku_id":1,"quantity":1,"coupon_id":null}`),
		"an absent field equals a null one, as over HTTP")
}

// The field lists' refusals hold without HTTP too: what encoding/json could
// read differently from the fingerprint is bad input.
func TestJSONFingerprint_AmbiguousBody_IsInvalid(t *testing.T) {
	t.Parallel()
	fp := idempotency.NewJSONFingerprint(idempotency.FingerprintConfig{Fields: []string{"quantity"}})
	for _, body := range []string{`{"quantity":1,"QUANTITY":2}`, `{"Quantity":1}`, `{"quantity":1,"quantity":2}`, `[1]`, `{"quantity":`} {
		_, err := fp("POST", "/orders", []byte(body))
		require.ErrorIs(t, err, idempotency.ErrInvalidBody, "body %s", body)
	}
}
