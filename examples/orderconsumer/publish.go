package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
)

// publish is the publish subcommand: one create to the consumer's subject
// or queue, with its reply printed when -reply asks for one.
func publish(args []string) error {
	fs := flag.NewFlagSet("orderconsumer publish", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: orderconsumer publish [flags] BODY\n\nPublishes one POST /orders body to orders.create.")
		fs.PrintDefaults()
	}
	broker := fs.String("broker", "nats://127.0.0.1:4222", "broker: nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/")
	user := fs.String("user", "", "X-User-ID header")
	key := fs.String("key", "", "Idempotency-Key header")
	id := fs.String("id", "", "message id (Nats-Msg-Id, message_id)")
	reply := fs.Bool("reply", false, "ask for the reply and print it")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the broker and the reply")
	topology := topologyFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("publish: want one BODY argument")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	topo := topology(orderqueue.ActionCreate)
	if err := orderqueue.EnsureTopology(ctx, *broker, topo); err != nil {
		return err
	}
	pub, err := orderqueue.Dial(*broker, topo)
	if err != nil {
		return err
	}
	defer pub.Close()
	m := orderqueue.Message{User: *user, Key: *key, ID: *id, Body: []byte(fs.Arg(0))}
	if !*reply {
		duplicate, err := pub.Publish(ctx, m)
		if err == nil && duplicate {
			fmt.Fprintln(os.Stderr, "the broker dropped it: a duplicate of a message id within its window")
		}
		return err
	}
	r, err := orderqueue.Request(ctx, pub, m)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("%s: %s\n", k, r.Header[k])
	}
	fmt.Printf("\n%s", r.Body)
	return nil
}
