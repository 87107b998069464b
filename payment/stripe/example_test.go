package idemstripe_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	idemstripe "github.com/orderguard/idempotency/payment/stripe"
)

func Example() {
	v, err := idemstripe.New(idemstripe.Config{Secrets: []string{"whsec_example"}})
	if err != nil {
		panic(err)
	}

	// What Stripe posts: the event and its Stripe-Signature header.
	at := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	body := []byte(`{"id": "evt_1", "object": "event", "type": "payment_intent.succeeded",
		"data": {"object": {"id": "pi_1", "object": "payment_intent", "amount": 1999,
		"amount_received": 1999, "currency": "usd", "metadata": {"order_no": "A-1001"}}}}`)
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
		Payload: body, Secret: "whsec_example", Timestamp: at,
	})
	header := http.Header{"Stripe-Signature": {signed.Header}}

	// In a handler, now is time.Now(); here it is a second later.
	ev, err := v.Verify(header, body, at.Add(time.Second))
	if err != nil {
		panic(err)
	}
	fmt.Println(ev.ID, ev.Kind, ev.OrderNo, ev.PaymentID, ev.Amount, ev.Currency)
	// Output: evt_1 succeeded A-1001 pi_1 1999 USD
}
