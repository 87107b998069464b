package payment_test

import (
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/frontendtest"
)

// The webhook front-end passes the payment events' part of the front-end
// conformance suite on MariaDB, WeChat Pay's callbacks signed and
// encrypted as WeChat Pay does (examples/server runs it on PostgreSQL,
// through the server's routes).
func TestFrontend_Webhook(t *testing.T) {
	t.Parallel()
	frontendtest.ExercisePayments(t, frontendtest.MySQL, func(t *testing.T, env *frontendtest.Env) frontendtest.PaymentFrontend {
		provider := frontendtest.NewWeChatPay(t)
		wh, err := env.Service.PaymentWebhook(provider.Verifier(t), nil)
		require.NoError(t, err)
		srv := httptest.NewServer(wh)
		t.Cleanup(srv.Close)
		return provider.Webhook(srv.URL)
	})
}
