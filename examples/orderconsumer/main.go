// Command orderconsumer consumes the example order service's creates from a
// queue, each message exactly one order under at-least-once delivery, on
// the same orderservice and databases as examples/server:
//
//	go run ./examples/orderconsumer -broker nats://127.0.0.1:4222 -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//	go run ./examples/orderconsumer -broker amqp://guest:guest@127.0.0.1:5672/ -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It consumes JSON bodies identical to POST /orders from subject
// orders.create (JetStream stream ORDERS, created if missing; durable
// consumer orderconsumer) or queue orders.create (RabbitMQ, declared
// durable, a quorum queue, if missing), with the user in header X-User-ID
// and the key in Idempotency-Key (falling back to the message id:
// Nats-Msg-Id, message_id). A message that asks for a reply (the Reply-To
// header on NATS, reply_to on AMQP) gets the JSON of the HTTP answer with
// a Status header (and Idempotent-Replayed: true on a replay). A message
// that can never be done goes to orders.create.dead-letter (a stream
// ORDERS_DEAD_LETTER, or a queue) with the reason in its headers.
//
// The RabbitMQ queue is declared so that the broker never drops an order
// the consumer requeues without limit (while another consumer holds its
// key, or the database is down): on RabbitMQ 4, whose quorum queues
// otherwise drop a message after 20 deliveries, with x-delivery-limit -1;
// and on every version with orders.create.dead-letter as its dead-letter
// queue, where a message goes if a limit applies all the same (an
// operator's policy), with the broker's reason in x-death. A queue that
// exists is used as it is: delete one declared by an earlier version of
// this example to have it declared so.
//
// With -action payment_events it consumes payment providers' events
// instead, as an event bridge forwards them from the provider's Standard
// Webhooks calls: the body byte for byte, with the headers webhook-id,
// webhook-timestamp and webhook-signature, from subject payments.events
// (stream PAYMENTS) or queue payments.events. Each is verified with
// -webhook-secret (the webhook's own secrets) and applied to the order's
// payment by the same action as examples/server's POST /webhooks/standard:
// the key is the event id (webhook-id), so an event that arrives both ways
// is applied once, whichever comes first. A forged, stale (webhook-timestamp
// further than -webhook-tolerance from now) or malformed event is
// dead-lettered (reason signature-not-verified, timestamp-outside-tolerance,
// malformed-event) with nothing written; an event id that arrives again
// with another payload is never applied, recorded as a payload-mismatch
// anomaly (idemctl anomalies) and acked, as the webhook acknowledges it:
//
//	go run ./examples/orderconsumer -action payment_events -webhook-secret whsec_… \
//	  -broker nats://127.0.0.1:4222 -db 'mysql://root@tcp(127.0.0.1:3306)/test'
//
// Publish with the same program (it waits for the reply with -reply):
//
//	go run ./examples/orderconsumer publish -broker nats://127.0.0.1:4222 \
//	  -user 7 -key queue-demo-1 -reply '{"user_id":7,"sku_id":20001,"quantity":1}'
//
// or, for RabbitMQ, with Debian's amqp-tools:
//
//	amqp-publish -u amqp://guest:guest@127.0.0.1:5672/ -r orders.create -p -C application/json \
//	  -H 'X-User-ID: 7' -H 'Idempotency-Key: queue-demo-2' -b '{"user_id":7,"sku_id":20001,"quantity":1}'
//
// Its flags, grouped, and what it needs running: go run ./examples/orderconsumer -h.
//
// The HTTP example server, the gRPC server and this consumer may share a
// database: a key used over one transport is the same action over the
// others.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/internal/cli"
	"github.com/orderguard/idempotency/examples/internal/dburl"
	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/queue"
)

func main() {
	run := consume
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "publish" {
		run, args = publish, args[1:]
	}
	if err := run(args); err != nil {
		fmt.Fprintln(os.Stderr, "orderconsumer:", err)
		os.Exit(1)
	}
}

func consume(args []string) (err error) {
	fs := flag.NewFlagSet("orderconsumer", flag.ContinueOnError)
	broker := fs.String("broker", "nats://127.0.0.1:4222", "broker `URL`: nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/")
	dbURL := fs.String("db", "sqlite://orders.db", dburl.Usage)
	modeName := fs.String("mode", "claim-first", "recording `MODE`: claim-first or single-phase")
	batch := fs.Int("batch", 1, "messages committed in one transaction at most")
	workers := fs.Int("workers", 4, "messages (or batches) done at once")
	maxDeliveries := fs.Int("max-deliveries", 5, "dead-letter a message whose handler failed on its Nth delivery")
	retryDelay := fs.Duration("retry-delay", time.Second, "delay of a message whose key is in progress or whose database failed")
	ackWait := fs.Duration("ack-wait", 30*time.Second, "JetStream: how long a delivery stays unacked before it is delivered again")
	lease := fs.Duration("lease", 30*time.Second, "how long a PROCESSING claim is held")
	retention := fs.Duration("retention", 24*time.Hour, "how long a finished key is remembered")
	inFlightWait := fs.Duration("in-flight-wait", 0, "how long a duplicate waits for the original to finish")
	reconcile := fs.Duration("reconcile-interval", 5*time.Second, "how often abandoned claims are settled (0 = off)")
	purge := fs.Duration("purge-interval", time.Minute, "how often expired records are deleted (0 = off)")
	handlerDelay := fs.Duration("handler-delay", 0, "artificial delay inside the create transaction")
	logLevel := fs.String("log-level", "info", "debug (one line per message), info or warn")
	action := fs.String("action", orderqueue.ActionCreate, "the action the messages carry: create_order, cancel_order or payment_events")
	webhookSecrets := fs.String("webhook-secret", "", "payment_events: Standard Webhooks signing `SECRETS` (whsec_…, comma-separated while one is rolled), the webhook's")
	webhookTolerance := fs.Duration("webhook-tolerance", 0, "payment_events: how far webhook-timestamp may be from now; 0 checks the signature only, so that a backlog is never dead-lettered as stale")
	topo := topologyFlags(fs)
	help.Install(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	var secrets []string
	switch *action {
	case orderqueue.ActionCreate, orderqueue.ActionCancel:
		if *webhookSecrets != "" {
			return errors.New("-webhook-secret: only -action payment_events verifies signatures")
		}
	case orderqueue.ActionPaymentEvents:
		if secrets, err = secretList(*webhookSecrets); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-action %q: want create_order, cancel_order or payment_events", *action)
	}
	mode, err := idempotency.ParseMode(*modeName)
	if err != nil {
		return fmt.Errorf("-mode: %w", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	point, err := crashPoint()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, store, dialect, err := dburl.Open(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := orderservice.Setup(ctx, db, dialect); err != nil {
		return fmt.Errorf("setup %s: %w", dialect, err)
	}
	svc, err := orderservice.New(db, orderservice.Options{
		Idempotency: true, Store: store, Dialect: dialect, HandlerDelay: *handlerDelay,
		AfterCreate: crashInHandler(point),
		Config:      idempotency.Config{Mode: mode, Lease: *lease, Retention: *retention, InFlightWait: *inFlightWait, Logger: log},
	})
	if err != nil {
		return err
	}
	go orderservice.Maintenance{
		Store: store, Reconciler: orderservice.Reconciler(store, svc, *reconcile, *retention, log, nil),
		PurgeInterval: *purge, Logger: log,
	}.Run(ctx)

	opts := orderqueue.Options{
		Action: *action, WebhookSecrets: secrets, WebhookTolerance: *webhookTolerance,
		Broker: *broker, Topology: topo(*action), Workers: *workers, BatchSize: *batch,
		MaxDeliveries: *maxDeliveries, RetryDelay: *retryDelay, AckWait: *ackWait, Logger: log,
		BeforeSettle: crashAfterCommit(point),
		Observe: func(s queue.Settlement) {
			log.Debug("settled", "decision", s.Decision.String(), "delivery", s.Message.Delivery,
				"status", answerStatus(s.Answer), "replayed", s.Answer.Replayed, "delay", s.Delay, "reason", s.Reason, "err", s.Err)
		},
	}
	log.Info("consuming", "action", *action, "broker", dburl.Redact(*broker), "db", dialect, "mode", *modeName, "batch", *batch, "workers", *workers)
	if err := orderqueue.Run(ctx, svc, opts); err != nil {
		return brokerError(*broker, err)
	}
	return nil
}

// brokerError names -broker in err, and says what to do when nothing
// answered there.
func brokerError(broker string, err error) error {
	err = fmt.Errorf("-broker %s: %w", dburl.Redact(broker), err)
	if cli.Unreachable(err) || errors.Is(err, nats.ErrNoServers) {
		return fmt.Errorf("%w\n  nothing answers at that address: start NATS (with JetStream) or RabbitMQ there, or change -broker", err)
	}
	return err
}

// help is what -h prints: what the consumer needs running, and its flags.
var help = cli.Help{
	Usage: "go run ./examples/orderconsumer [flags]\n       go run ./examples/orderconsumer publish [flags] BODY",
	About: "Consumes POST /orders bodies from a queue, each message exactly one order " +
		"(-action cancel_order: cancels; -action payment_events: payment providers' Standard Webhooks events), " +
		"on the same order service and databases as examples/server.",
	Needs: "a broker at -broker: NATS with JetStream (nats://, the default 127.0.0.1:4222) or RabbitMQ (amqp://). " +
		"The database is the embedded SQLite file orders.db unless -db names MariaDB/MySQL or PostgreSQL.",
	Examples: []string{
		"go run ./examples/orderconsumer -broker nats://127.0.0.1:4222",
		"go run ./examples/orderconsumer -broker amqp://guest:guest@127.0.0.1:5672/ -db 'mysql://root@tcp(127.0.0.1:3306)/test'",
		"go run ./examples/orderconsumer publish -broker nats://127.0.0.1:4222 -user 7 -key demo-1 -reply '{\"user_id\":7,\"sku_id\":20001,\"quantity\":1}'",
	},
	Groups: []cli.Group{
		cli.Flags("Broker", "broker", "action", "stream", "subject", "durable", "queue"),
		cli.Flags("Delivery", "workers", "batch", "max-deliveries", "retry-delay", "ack-wait"),
		cli.Flags("Database", "db"),
		cli.Flags("Idempotency", "mode", "lease", "retention", "in-flight-wait", "reconcile-interval", "purge-interval", "handler-delay"),
		cli.Flags("Payment events (-action payment_events)", "webhook-secret", "webhook-tolerance"),
		cli.Flags("Logging", "log-level"),
	},
}

// topologyFlags adds the flags that name the subject, stream and queue,
// and returns the topology they name once parsed, for an action: a name
// not given is the action's default (orderqueue.DefaultTopology, or
// orderqueue.PaymentTopology for payment_events).
func topologyFlags(fs *flag.FlagSet) func(action string) orderqueue.Topology {
	def := orderqueue.DefaultTopology()
	stream := fs.String("stream", def.Stream, "JetStream stream (dead letters: STREAM_DEAD_LETTER; payment_events: PAYMENTS)")
	subject := fs.String("subject", def.Subject, "JetStream subject (dead letters: SUBJECT.dead-letter; payment_events: payments.events)")
	durable := fs.String("durable", def.Durable, "JetStream durable consumer")
	queueName := fs.String("queue", def.Queue, "RabbitMQ queue (dead letters: QUEUE.dead-letter; payment_events: payments.events)")
	return func(action string) orderqueue.Topology {
		if action != orderqueue.ActionPaymentEvents {
			return orderqueue.NamedTopology(*stream, *subject, *durable, *queueName)
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		or := func(name, given, def string) string {
			if set[name] {
				return given
			}
			return def
		}
		pay := orderqueue.PaymentTopology()
		return orderqueue.NamedTopology(or("stream", *stream, pay.Stream), or("subject", *subject, pay.Subject),
			or("durable", *durable, pay.Durable), or("queue", *queueName, pay.Queue))
	}
}

// secretList is -webhook-secret's comma-separated list: at least one
// secret, each whsec_<base64> (the prefix checked here, the base64 by
// orderqueue.PaymentConfig). Never a secret's value in an error.
func secretList(value string) ([]string, error) {
	if value == "" {
		return nil, errors.New("-action payment_events needs -webhook-secret: the Standard Webhooks signing secret (whsec_…) the webhook verifies with")
	}
	secrets := strings.Split(value, ",")
	for i, s := range secrets {
		secrets[i] = strings.TrimSpace(s)
		if !strings.HasPrefix(secrets[i], "whsec_") {
			return nil, fmt.Errorf("-webhook-secret: secret %d of %d does not start with whsec_; copy the endpoint's signing secret", i+1, len(secrets))
		}
	}
	return secrets, nil
}

func answerStatus(a idempotency.Answer) int {
	if a.Problem != nil {
		return a.Problem.Status
	}
	return a.Status
}
