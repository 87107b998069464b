// Package idemamqp is the RabbitMQ (AMQP 0-9-1) front-end of the
// idempotency protocol: a consumer whose every message makes exactly one
// order (or whatever its handler does) under the broker's at-least-once
// delivery.
//
// A Consumer consumes a queue with manual acks and a prefetch, and does
// each delivery under the protocol with package queue's Processor: the
// key from the Idempotency-Key header, else message_id; the handler in the
// record's transaction; the delivery acked only after the commit; acked
// without running again when its record is final (its recorded reply
// published again to its reply_to, with its correlation_id); held and then
// negatively acked with requeue (a delayed nack) while another consumer
// holds its key or the database fails; published with the reason in its
// headers to Config.DeadLetterQueue, confirmed, and then acked, when it
// can never be done. It dials again after every lost connection: the
// broker has requeued what was not acked, and each redelivery finds its
// record.
//
//	c, _ := idemamqp.New(idemamqp.Config{
//		Config: queue.Config{Middleware: mw, Handler: createOrder, Route: "POST /orders",
//			Fingerprint: idempotency.FingerprintConfig{Fields: fields}},
//		URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "orders.create",
//		DeadLetterQueue: "orders.create.dead-letter",
//	})
//	err := c.Run(ctx)
//
// Replies and dead letters are published mandatory, with publisher
// confirms: one that no queue takes comes back (basic.return) instead of
// being confirmed and dropped. A dead letter that comes back (its queue
// was deleted) leaves its message in the queue, delivered again; a reply
// that comes back (its reply_to queue is gone with its client) wraps
// queue.ErrUndeliverable, so that the message, done, is acked all the
// same.
//
// A delivery's count is a quorum queue's x-delivery-count
// (Config.QueueType QuorumQueue); on a classic queue, which keeps none,
// the Consumer counts the deliveries it saw of each key itself (the key
// the processor claims, whatever header carries it), so
// Config.MaxDeliveries is then per consumer process. A dead letter leaves
// the broker's counters behind (x-delivery-count, x-death, …): moved back
// to its queue after a fix, it starts from its first delivery.
//
// On RabbitMQ 4, a quorum queue drops or dead-letters a message past its
// delivery limit, 20 deliveries by default, and every requeue counts: the
// Consumer, which requeues a message without limit while another consumer
// holds its key or the database is down, needs the queue declared with
// x-delivery-limit -1 (RabbitMQ 4 only: RabbitMQ 3 reads -1 as a limit),
// or a dead-letter exchange, or both, as examples/orderconsumer declares
// them.
package idemamqp
