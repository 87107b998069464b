// Package idemnats is the NATS JetStream front-end of the idempotency
// protocol: a pull consumer whose every message makes exactly one order
// (or whatever its handler does) under JetStream's at-least-once delivery.
//
// A Consumer takes messages from a jetstream.Consumer (durable, explicit
// acks, MaxDeliver -1: the consumer decides when a message is dead) and
// does each under the protocol with package queue's Processor: the key
// from the Idempotency-Key header, else Nats-Msg-Id; the handler in the
// record's transaction; the message acked only after the commit; acked
// without running again when its record is final (its recorded reply
// published again to its Reply-To header's subject); negatively acked
// with a delay (NakWithDelay) while another consumer holds its key or the
// database fails; dead-lettered to Config.DeadLetterSubject with the
// reason in its headers, then terminated, when it can never be done.
//
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable: "orders", FilterSubject: "orders.create",
//		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
//	})
//	c, _ := idemnats.New(js, cons, idemnats.Config{
//		Config: queue.Config{Middleware: mw, Handler: createOrder, Route: "POST /orders",
//			Fingerprint: idempotency.FingerprintConfig{Fields: fields}},
//		DeadLetterSubject: "orders.create.dead-letter",
//	})
//	err := c.Run(ctx)
//
// JetStream's own deduplication (Nats-Msg-Id within the stream's
// Duplicates window) drops a publisher's retries for a few minutes; the
// record keeps the key for its retention, in the order's transaction, and
// covers every redelivery as well.
package idemnats
