package queue_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

// A Processor turns each delivered message into the action of the HTTP
// route that shares its Middleware: the key is the Idempotency-Key header
// (else the message id), the scope the X-User-ID header, the fingerprint
// the route's over the payload. The handler writes in the record's
// transaction; the message is acked after the commit, and a redelivery is
// acked without running again. The brokers' consumers (idemnats,
// idemamqp) run a Processor over their deliveries; here one is given
// messages by hand. A message that can never be done is dead-lettered,
// before anything is written, so this part runs without a database.
func ExampleNew() {
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Operation: &idempotency.Operation{
			Name: "create_order", Route: "POST /orders", Status: http.StatusCreated,
			Fields: []string{"user_id", "sku_id", "quantity"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	p, err := queue.New("orders.create", queue.Config{
		Middleware:  mw,
		ScopeHeader: "X-User-ID",
		Handler: func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
			// ... write the order with tx; never commit it ...
			return idempotency.Result{Status: http.StatusCreated, Body: []byte(`{"order_no":"O-1"}`)}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	p.Process(context.Background(), []queue.Delivery{
		printed{&queue.Message{Header: map[string][]string{"X-User-ID": {"7"}},
			Body: []byte(`{"user_id":7,"sku_id":20001,"quantity":1}`)}}, // no key, no message id
		printed{&queue.Message{ID: "m-2", Header: map[string][]string{"X-User-ID": {"7"}},
			Body: []byte(`{"user_id":7,"sku_id":`)}}, // a payload that does not decode
	})
	// Output:
	// dead letter: reason missing-key, status 400
	// dead letter: reason invalid-body, status 400
}

// printed is a delivery that prints how it is settled.
type printed struct{ m *queue.Message }

func (d printed) Message() *queue.Message { return d.m }
func (d printed) Ack(context.Context) error {
	fmt.Println("ack")
	return nil
}
func (d printed) Nak(_ context.Context, delay time.Duration) error {
	fmt.Println("nak, again after", delay)
	return nil
}
func (d printed) DeadLetter(_ context.Context, h map[string]string) error {
	fmt.Printf("dead letter: reason %s, status %s\n", h[queue.ReasonHeader], h[queue.DeadStatusHeader])
	return nil
}
func (d printed) Reply(_ context.Context, r queue.Reply) error {
	fmt.Println("reply:", r.Status, string(r.Body))
	return nil
}
