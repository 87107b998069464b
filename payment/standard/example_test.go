package idemstandard_test

import (
	"fmt"
	"time"

	idemstandard "github.com/orderguard/idempotency/payment/standard"
)

func Example() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	v, err := idemstandard.New(idemstandard.Config{Secrets: []string{secret}})
	if err != nil {
		panic(err)
	}

	// A sender signs the message with Sign.
	at := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	body := []byte(`{"type": "payment.succeeded", "timestamp": "2025-03-14T09:26:50Z",
		"data": {"order_no": "A-1001", "payment_id": "pay_7Hq2", "amount": 1999, "currency": "USD"}}`)
	header, err := idemstandard.Sign(secret, "msg_2Lh7Zq", at, body)
	if err != nil {
		panic(err)
	}

	// In a handler, now is time.Now(); here it is a second later.
	ev, err := v.Verify(header, body, at.Add(time.Second))
	if err != nil {
		panic(err)
	}
	fmt.Println(ev.ID, ev.Kind, ev.OrderNo, ev.PaymentID, ev.Amount, ev.Currency)
	// Output: msg_2Lh7Zq succeeded A-1001 pay_7Hq2 1999 USD
}
