// Package queue is the transport-free half of an idempotent queue
// consumer: what a message's action is (key, scope, fingerprint), how the
// protocol does it (idempotency.Middleware.Do, or DoBatch for a batch in
// one transaction), and what the consumer then does with the message
// (Decision): ack, negative-ack with a delay, or dead-letter with the
// reason in its headers. The broker front-ends are modules of their own:
// package idemnats (NATS JetStream, github.com/orderguard/idempotency/nats)
// and package idemamqp (RabbitMQ and AMQP 0-9-1,
// github.com/orderguard/idempotency/amqp); each turns its broker's
// deliveries into Deliveries and feeds a Processor.
//
// Under at-least-once delivery a message arrives again after every crash
// between the commit and the ack, every lost ack and every publisher
// retry. The record of its key is committed with its effects, in one
// transaction, before the message is acked; so a message delivered again
// finds its record and is acked without running again (its recorded reply
// published again when it asked for one), whatever happened between the
// commit and the ack. A message is acked only after its run committed, or
// its final refusal was recorded; a message whose key another consumer
// holds, or whose database failed, is delivered again after a delay and
// never acked meanwhile.
//
// The key is the message's Idempotency-Key header, else its id (JetStream's
// Nats-Msg-Id, AMQP's message_id), or what Config.Key says; the scope is a
// header's (Config.ScopeHeader) or Config.Scope's; the fingerprint is the
// HTTP route's over the JSON payload (Config.Route and
// Config.Fingerprint), so that a key used over HTTP and then in a message
// is one action: replayed with the same business fields, refused as
// reused with others.
package queue
