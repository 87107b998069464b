package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsume_ABrokerThatIsNotRunningIsAnErrorNamingTheFlag: a newcomer
// who starts the consumer before NATS or RabbitMQ reads which flag to
// change, with the password of the URL hidden.
func TestConsume_ABrokerThatIsNotRunningIsAnErrorNamingTheFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there now
	db := "sqlite://" + filepath.Join(t.TempDir(), "orders.db")
	for _, broker := range []string{"nats://" + addr, "amqp://guest:secret@" + addr + "/"} {
		err := consume([]string{"-broker", broker, "-db", db, "-reconcile-interval", "0", "-purge-interval", "0"})
		if err == nil {
			t.Fatalf("consume -broker %s: nil error, want one", broker)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "-broker ") || !strings.Contains(msg, "nothing answers at that address") {
			t.Errorf("consume -broker %s: %q, want it to name -broker and say nothing answers", broker, msg)
		}
		if strings.Contains(msg, "secret") {
			t.Errorf("consume -broker %s: %q shows the password", broker, msg)
		}
	}
}
