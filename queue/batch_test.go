package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

func TestABatch_CommitsInOneTransaction_EveryMessageAckedAfterIt(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		b := setup(t, idempotency.Config{Mode: mode}, nil)
		var ds []*fakeDelivery
		for i := range 5 {
			key := fmt.Sprintf("k%d", i)
			d := msg(key, order, 1)
			d.onAck = func() { require.Equal(t, 1, b.effects(t, key), "acked after its commit") }
			ds = append(ds, d)
		}
		b.process(ds...)
		for i, d := range ds {
			require.Equal(t, []string{"ack"}, d.settled(), "message %d", i)
		}
		for _, tx := range b.txs {
			require.Same(t, b.txs[0], tx, "mode %v: one transaction for the batch", mode)
		}
	}
}

// A message that fails in a batch sends the batch one by one: the others
// commit and are acked, the failing one is naked, each effect once.
func TestAFailingMessage_SendsItsBatchOneByOne_TheOthersAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	b.answer("bad", http.StatusInternalServerError)
	ds := b.process(msg("a", order, 1), msg("bad", order, 1), msg("c", order, 1), msg("a", order, 1))
	require.Equal(t, []string{"ack"}, ds[0].settled())
	require.Equal(t, []string{"nak 1s"}, ds[1].settled())
	require.Equal(t, []string{"ack"}, ds[2].settled())
	require.Equal(t, []string{"ack"}, ds[3].settled(), "the same key later in the batch replays")
	for _, k := range []string{"a", "c"} {
		require.Equal(t, 1, b.effects(t, k))
	}
	require.Zero(t, b.effects(t, "bad"))
}

// The baseline does a redelivered message again: what the protocol is
// measured against, and why it exists.
func TestUnprotected_RunsARedeliveryAgain(t *testing.T) {
	t.Parallel()
	db := setup(t, idempotency.Config{}, nil).db
	b := build(t, db, nil, func(c *queue.Config) {
		c.Middleware, c.Unprotected = nil, db
		c.Validate = func(m *queue.Message) error {
			if !json.Valid(m.Body) {
				return errors.New("not JSON")
			}
			return nil
		}
	})
	d := b.process(msg("k1", order, 1))[0]
	require.Equal(t, []string{"ack"}, d.settled())
	again := b.process(d.redeliver())[0]
	require.Equal(t, []string{"nak 250ms"}, again.settled(), "the duplicate's insert failed: 503")
	require.Equal(t, 2, b.runCount("k1"), "it ran again")
	batch := b.process(msg("k2", order, 1), msg("k3", order, 1), msg("k4", `{"sku_id":`, 1))
	require.Equal(t, []string{"ack"}, batch[0].settled())
	require.Equal(t, []string{"ack"}, batch[1].settled())
	require.Equal(t, []string{"dead-letter " + idempotency.ProblemInvalidBody}, batch[2].settled(),
		"the application's checks hold without the protocol")
	require.Zero(t, b.runCount("k4"))
}

// Run takes what waits in the channel, up to BatchSize at a time, and
// settles all of it before it returns.
func TestRun_TakesBatchesOfWhatWaits_SettlesEverything(t *testing.T) {
	t.Parallel()
	var sizes []int
	b := setup(t, idempotency.Config{}, func(c *queue.Config) { c.BatchSize, c.Workers = 4, 1 })
	in := make(chan queue.Delivery, 10)
	var ds []*fakeDelivery
	for i := range 10 {
		d := msg(fmt.Sprintf("r%d", i), order, 1)
		ds = append(ds, d)
		in <- d
	}
	close(in)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.p.Run(ctx, in)
	for i, d := range ds {
		require.Equal(t, []string{"ack"}, d.settled(), "message %d", i)
	}
	distinct := map[any]int{}
	for _, tx := range b.txs {
		distinct[tx]++
	}
	for _, n := range distinct {
		sizes = append(sizes, n)
		require.LessOrEqual(t, n, 4, "a batch is at most BatchSize")
	}
	require.Len(t, distinct, 3, "10 waiting messages in batches of 4: 4, 4 and 2 (%v)", sizes)
}
