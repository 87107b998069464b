// Package brokertest gives tests the message brokers they run against:
// NATS with JetStream and RabbitMQ, on the machine's usual ports unless
// IDEMPOTENCY_TEST_NATS_URL or IDEMPOTENCY_TEST_AMQP_URL say otherwise.
// When a broker does not answer the test is skipped with a message, unless
// CI=true or IDEMPOTENCY_REQUIRE_BROKERS=1, in which case it fails: CI
// must never pass by skipping. Each test names what it creates on a broker
// with Name, so that tests running at once never share a stream or a
// queue.
package brokertest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Defaults, used when the environment names no broker.
const (
	DefaultNATS = "nats://127.0.0.1:4222"
	DefaultAMQP = "amqp://guest:guest@127.0.0.1:5672/"
)

// Required reports whether broker tests must run (fail instead of skip).
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("IDEMPOTENCY_REQUIRE_BROKERS") == "1"
}

// NATS returns the URL of a NATS server with JetStream.
func NATS(t testing.TB) string {
	return reachable(t, "IDEMPOTENCY_TEST_NATS_URL", DefaultNATS)
}

// AMQP returns the URL of a RabbitMQ broker.
func AMQP(t testing.TB) string {
	return reachable(t, "IDEMPOTENCY_TEST_AMQP_URL", DefaultAMQP)
}

func reachable(t testing.TB, env, def string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s=%q: %v", env, raw, err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		if Required() {
			t.Fatalf("broker %s unreachable (%v); CI requires it (scripts/services.sh starts it)", u.Host, err)
		}
		t.Skipf("broker %s unreachable (%v); set %s or start it (scripts/services.sh)", u.Host, err, env)
	}
	conn.Close()
	return raw
}

// Name returns prefix followed by a random suffix: a name of this test's
// own for a stream, subject, consumer or queue. It holds letters, digits
// and underscores only, which every broker's names allow.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}
