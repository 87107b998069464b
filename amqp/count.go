package idemamqp

import (
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/orderguard/idempotency/queue"
)

// QueueType is the type of the queue consumed: it says whether the broker
// counts a message's deliveries.
type QueueType string

const (
	// ClassicQueue keeps no count, only whether a delivery is a
	// redelivery: the Consumer counts the deliveries it saw of each key
	// itself, and an x-delivery-count header is the publisher's, never
	// trusted.
	ClassicQueue QueueType = "classic"
	// QuorumQueue writes its own count in x-delivery-count on every
	// delivery, over whatever the publisher sent under that name (RabbitMQ
	// 3.10 was seen doing so: 0 on the first delivery of a message
	// published with 99).
	QuorumQueue QueueType = "quorum"
)

// brokerHeader reports whether the header name is one the broker writes on
// a message to count its deliveries or record its dead-lettering: a dead
// letter leaves them behind, so that a dead letter moved back to its queue
// starts its count again and the broker's dead-letter cycle detection does
// not read another life's x-death.
func brokerHeader(name string) bool {
	switch name = strings.ToLower(name); {
	case name == "x-delivery-count", name == "x-acquired-count", name == "x-death":
		return true
	case strings.HasPrefix(name, "x-first-death-"), strings.HasPrefix(name, "x-last-death-"):
		return true
	}
	return false
}

// deliveryCounts counts the deliveries of each message a queue does not
// count for us (a classic queue keeps no count: only whether a delivery
// is a redelivery).
type deliveryCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// maxCounted bounds the counts kept: past it they start again (a message
// then dead-letters later than MaxDeliveries says, never sooner).
const maxCounted = 1 << 16

func newDeliveryCounts() *deliveryCounts { return &deliveryCounts{n: map[string]int{}} }

// countID is what a message's deliveries are counted by: the key the
// processor claims for it (Config.Key: by default the Middleware's key
// header, else the message id) in its scope, so that a message counts
// whatever header carries its key. A message without a key is refused
// (dead-lettered) on its first delivery, and needs no count: "".
func countID(cfg queue.Config, m *queue.Message) string {
	key, err := cfg.Key(m)
	if err != nil || key == "" {
		return ""
	}
	scope, err := cfg.Scope(m)
	if err != nil {
		return ""
	}
	return scope + "\x00" + key
}

// seen counts d and returns its delivery number: on a quorum queue its
// x-delivery-count + 1, else this consumer's count of id.
func (c *deliveryCounts) seen(t QueueType, id string, d amqp.Delivery) int {
	own := c.count(id, d)
	if t == QuorumQueue {
		// The broker's count covers other consumers and restarts; this
		// consumer's covers requeues a broker does not count (RabbitMQ
		// 4.3 counts basic.reject, not basic.nack): the larger of the two.
		if n, ok := deliveryCount(d.Headers["x-delivery-count"]); ok {
			return max(n+1, own)
		}
		// No count: the queue is not a quorum queue after all.
	}
	return own
}

// count is this consumer's count of d's deliveries.
func (c *deliveryCounts) count(id string, d amqp.Delivery) int {
	if id == "" {
		if d.Redelivered {
			return 2
		}
		return 1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !d.Redelivered {
		c.n[id] = 0
	}
	if len(c.n) >= maxCounted {
		clear(c.n)
	}
	c.n[id]++
	return c.n[id]
}

func (c *deliveryCounts) forget(id string) {
	if id == "" {
		return
	}
	c.mu.Lock()
	delete(c.n, id)
	c.mu.Unlock()
}

func deliveryCount(v any) (int, bool) {
	switch v := v.(type) {
	case int64:
		return int(v), true
	case int32:
		return int(v), true
	case int:
		return v, true
	case int16:
		return int(v), true
	case int8:
		return int(v), true
	case uint8:
		return int(v), true
	case uint16:
		return int(v), true
	case uint32:
		return int(v), true
	}
	return 0, false
}
