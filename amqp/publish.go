package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/orderguard/idempotency/queue"
)

// PublishIDHeader is set on every dead letter and every reply (but those
// to the direct reply-to pseudo-queue) the Consumer publishes, to a value
// unique on its channel: a basic.return carries no delivery tag, and this
// header is what tells the Consumer which of its publishes, several
// workers' at once, the broker returned. It means nothing else.
const PublishIDHeader = "Idemamqp-Publish-Id"

// errReturned is a publish the broker confirmed without routing it to any
// queue (basic.return): the queue named does not exist (any more).
type errReturned struct {
	key  string
	code uint16
	text string
}

func (e *errReturned) Error() string {
	return fmt.Sprintf("queue %q does not exist: the broker returned the message (%d %s)", e.key, e.code, e.text)
}

// publisher publishes on one session's confirming channel and tells each
// publish whether the broker took it into a queue.
type publisher struct {
	ch      *amqp.Channel
	returns *returnWatch
	next    atomic.Uint64
}

func newPublisher(ch *amqp.Channel) *publisher {
	// Buffered, so that the client's reader never waits on the watcher
	// (the client drops a return it cannot hand over within 5s).
	c := ch.NotifyReturn(make(chan amqp.Return, 64))
	return &publisher{ch: ch, returns: watchReturns(c)}
}

// publish publishes msg to the queue key through the default exchange and
// waits for the broker's confirm. With mandatory set, a message that no
// queue takes is an *errReturned: without the flag RabbitMQ confirms it
// all the same and drops it. A nack, a lost channel or ctx's end is an
// error too, and may be worth trying again.
func (p *publisher) publish(ctx context.Context, key string, mandatory bool, msg amqp.Publishing) error {
	id := strconv.FormatUint(p.next.Add(1), 10)
	if mandatory {
		h := make(amqp.Table, len(msg.Headers)+1)
		for k, v := range msg.Headers {
			h[k] = v
		}
		h[PublishIDHeader] = id
		msg.Headers = h
		p.returns.expect(id)
		defer p.returns.forget(id)
	}
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", key, mandatory, false, msg)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return err
	case !ok:
		return errors.New("the broker did not confirm it (basic.nack, or the channel closed)")
	case !mandatory:
		return nil
	}
	r, err := p.returns.returned(ctx, id)
	switch {
	case err != nil:
		return err
	case r != nil:
		return &errReturned{key: key, code: r.ReplyCode, text: r.ReplyText}
	}
	return nil
}

// returnWatch collects the basic.returns of the publishes that expect
// one. RabbitMQ sends a mandatory message's basic.return before its
// basic.ack, and the client hands the return to NotifyReturn's channel
// before it resolves the confirm: once a publish's confirm has arrived,
// its return, if any, is in that channel or already taken from it. The
// watcher alone takes from the channel, and asked after a confirm, it
// first takes all that waits there: its answer then holds every return
// the broker sent before that confirm. (Publishing one message at a time
// would need no watcher, but would make every worker wait for the others'
// confirms.)
type returnWatch struct {
	asks   chan chan struct{}
	closed chan struct{} // the channel closed: every return is recorded

	mu  sync.Mutex
	got map[string]*amqp.Return // by publish id, of those expecting one: nil while none
}

func watchReturns(c <-chan amqp.Return) *returnWatch {
	w := &returnWatch{asks: make(chan chan struct{}), closed: make(chan struct{}), got: map[string]*amqp.Return{}}
	go w.run(c)
	return w
}

func (w *returnWatch) run(c <-chan amqp.Return) {
	defer close(w.closed)
	for {
		select {
		case r, ok := <-c:
			if !ok {
				return
			}
			w.record(r)
		case answered := <-w.asks:
			for waiting := true; waiting; {
				select {
				case r, ok := <-c:
					if !ok {
						close(answered)
						return
					}
					w.record(r)
				default:
					waiting = false
				}
			}
			close(answered)
		}
	}
}

func (w *returnWatch) record(r amqp.Return) {
	id, _ := r.Headers[PublishIDHeader].(string)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, expected := w.got[id]; expected {
		w.got[id] = &r
	}
}

func (w *returnWatch) expect(id string) {
	w.mu.Lock()
	w.got[id] = nil
	w.mu.Unlock()
}

func (w *returnWatch) forget(id string) {
	w.mu.Lock()
	delete(w.got, id)
	w.mu.Unlock()
}

// returned is publish id's return, nil if the broker sent none before its
// confirm, which must have arrived.
func (w *returnWatch) returned(ctx context.Context, id string) (*amqp.Return, error) {
	answered := make(chan struct{})
	select {
	case w.asks <- answered:
		select {
		case <-answered:
		case <-w.closed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case <-w.closed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got[id], nil
}

// directReplyTo reports whether the reply_to is RabbitMQ's direct
// reply-to pseudo-queue, which a mandatory publish cannot be told about:
// RabbitMQ 3.10 returns every reply to it (312 NO_ROUTE), delivered or
// not (rabbitmq-server#6124).
func directReplyTo(replyTo string) bool {
	return strings.HasPrefix(replyTo, "amq.rabbitmq.reply-to")
}

// undeliverable wraps a returned reply's error in queue.ErrUndeliverable:
// its queue is gone and delivering the message again cannot bring it
// back. Any other error is left as it is, to be tried again.
func undeliverable(err error) error {
	var returned *errReturned
	if errors.As(err, &returned) {
		return fmt.Errorf("idemamqp: reply to %s: %w: %w", returned.key, queue.ErrUndeliverable, err)
	}
	return err
}
