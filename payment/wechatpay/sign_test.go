package wechatpay_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/payment"
	"github.com/orderguard/idempotency/payment/wechatpay"
)

// TestSignAndEncrypt_MakeACallbackTheVerifierReads: what a simulator
// builds with Sign and Encrypt is a callback the Verifier takes, and a
// byte changed after signing is refused.
func TestSignAndEncrypt_MakeACallbackTheVerifierReads(t *testing.T) {
	b := setup(t, wechatpay.Config{})
	plaintext, err := json.Marshal(transactionSuccess())
	require.NoError(t, err)
	resource, err := wechatpay.Encrypt(apiV3Key, "transaction", plaintext)
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{
		"id": "EV-sign-1", "create_time": "2024-06-11T22:34:03+08:00", "resource_type": "encrypt-resource",
		"event_type": "TRANSACTION.SUCCESS", "summary": "支付成功", "resource": resource,
	})
	require.NoError(t, err)
	header, err := wechatpay.Sign(b.key, serial, now, body)
	require.NoError(t, err)

	ev, err := b.verifier.Verify(header, body, now)
	require.NoError(t, err)
	require.Equal(t, "EV-sign-1", ev.ID)
	require.Equal(t, payment.Succeeded, ev.Kind)

	tampered := append([]byte(nil), body...)
	tampered[len(tampered)-2] = ' '
	_, err = b.verifier.Verify(header, tampered, now)
	require.ErrorIs(t, err, payment.ErrSignature)

	header, err = wechatpay.Sign(otherKey(), serial, now, body)
	require.NoError(t, err)
	_, err = b.verifier.Verify(header, body, now)
	require.ErrorIs(t, err, payment.ErrSignature)
}
