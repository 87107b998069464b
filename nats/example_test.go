package idemnats_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderguard/idempotency"
	idemnats "github.com/orderguard/idempotency/nats"
	"github.com/orderguard/idempotency/queue"
)

// A JetStream consumer of order commands: each message on orders.create
// is the action POST /orders, under its Idempotency-Key header (else its
// Nats-Msg-Id) and the user in X-User-ID, so it makes exactly one order
// however often JetStream delivers it, and a key used over HTTP is the
// same order. A message that can never be done goes to the dead-letter
// subject with its reason. examples/orderconsumer is a complete consumer.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
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
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "orders", FilterSubject: "orders.create",
		AckPolicy:  jetstream.AckExplicitPolicy,
		MaxDeliver: -1, // the consumer decides when a message is dead
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemnats.New(js, cons, idemnats.Config{
		Config: queue.Config{
			Middleware:  mw,
			ScopeHeader: "X-User-ID",
			Handler: func(ctx context.Context, tx *sql.Tx, m *queue.Message) idempotency.Result {
				// ... write the order with tx; never commit it ...
				return idempotency.Result{Status: http.StatusCreated, Body: []byte(`{"order_no":"O-1"}`)}
			},
		},
		DeadLetterSubject: "orders.create.dead-letter", // a subject a stream stores
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
