package main

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	idemstandard "github.com/orderguard/idempotency/payment/standard"
)

// The provider's side of one callback: a genuine delivery with the
// provider's retries, a forged one, and the HTTP request they share.

// deliver delivers ev as its provider does: signed afresh on every attempt,
// again after backoff while the answer is not a 2xx (or is lost), up to
// Tries attempts. copy tells concurrent deliveries of one event apart in
// the draws. It reports whether the provider saw the event acknowledged.
func (r *runner) deliver(ctx context.Context, pv *provider, ev event, copy string) bool {
	body := pv.body(ev)
	for try := 1; try <= r.cfg.Tries; try++ {
		if try > 1 {
			r.retries.Add(1)
			if !sleep(ctx, r.backoff(try-1)) {
				return false
			}
		}
		h, signed, err := pv.sign(ev, body, time.Now())
		if err != nil {
			return false
		}
		status, answer, ok := r.post(ctx, pv, h, signed)
		if !ok {
			continue
		}
		if r.draw("lost", ev.ID+"/"+copy, try) < r.cfg.LostAnswerRate {
			r.lost.Add(1)
			continue
		}
		if pv.acked(status, answer) {
			return true
		}
	}
	r.unacked.Add(1)
	return false
}

// forge sends one forged or stale callback for ev, once: an attacker, not
// the provider, so no retries.
func (r *runner) forge(ctx context.Context, pv *provider, ev event, kind forgery) {
	body := pv.body(ev)
	var h http.Header
	var err error
	now := time.Now()
	switch kind {
	case forgeWrongSecret:
		h, body, err = pv.signAsStranger(ev, body, now)
	case forgeTampered:
		// Signed for a refund of 1, delivered claiming the whole amount.
		small := ev
		small.Amount, small.Refunded = 1, 1
		var signed []byte
		if h, signed, err = pv.sign(small, pv.body(small), now); err == nil {
			h, body = pv.tamper(h, signed, body)
		}
	case forgeUnsigned:
		h = http.Header{}
		if pv.Name == idemstandard.Provider {
			h.Set(idemstandard.IDHeader, ev.ID)
			h.Set(idemstandard.TimestampHeader, strconv.FormatInt(now.Unix(), 10))
		}
	case forgeStale:
		h, body, err = pv.sign(ev, body, now.Add(-10*time.Minute))
	case forgeForeign:
		h, body, err = pv.sign(ev, pv.foreign(ev), now)
	}
	if err != nil {
		return
	}
	r.mu.Lock()
	r.forged[kind]++
	r.forgedIDs[ev.ID] = true
	r.mu.Unlock()
	status, answer, ok := r.post(ctx, pv, h, body)
	if ok && (pv.acked(status, answer) || (status >= 200 && status < 300)) {
		r.mu.Lock()
		r.forgedOK[ev.ID] = true
		r.mu.Unlock()
	}
}

// post sends one delivery and tallies its answer.
func (r *runner) post(ctx context.Context, pv *provider, h http.Header, body []byte) (status int, answer []byte, ok bool) {
	r.deliveries.Add(1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.t.URL+pv.Path, bytes.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", pv.contentType)
	resp, err := r.http.Do(req)
	if err != nil {
		r.transport.Add(1)
		return 0, nil, false
	}
	answer, err = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if err != nil {
		r.transport.Add(1)
		return 0, nil, false
	}
	r.mu.Lock()
	r.answers[resp.StatusCode]++
	r.mu.Unlock()
	return resp.StatusCode, answer, true
}

// backoff is the provider's schedule, compressed: RetryBase, 2×, 4×, ….
func (r *runner) backoff(retry int) time.Duration {
	return r.cfg.RetryBase << min(retry-1, 20)
}

// draw is a uniform number in [0, 1) fixed by the seed, what and n: the
// same faults on every run of a seed, whatever the goroutines' order.
func (r *runner) draw(what, id string, n int) float64 {
	h := fnv.New64a()
	// The event id carries the run's nonce; the draw must not.
	fmt.Fprintf(h, "%s#%s#%d", what, strings.Replace(id, r.run, "", 1), n)
	return mrand.New(mrand.NewPCG(r.cfg.Seed, h.Sum64())).Float64()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
