package queue

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"strconv"
	"strings"
	"time"

	"github.com/orderguard/idempotency"
)

// Decision is what a consumer does with a delivered message.
type Decision int

const (
	// Ack: the message is done, its answer committed or recorded (or
	// replayed from the record); it is removed from its queue.
	Ack Decision = iota + 1
	// Nak: the message is not done; the broker delivers it again after
	// Settlement.Delay. Nothing of it was committed.
	Nak
	// DeadLetter: the message can never be done (bad input, its key
	// reused with another payload, a handler that kept failing); it is
	// moved to the dead letters with the reason in its headers.
	DeadLetter
)

// String names the decision as the logs do: ack, nak, dead-letter.
func (d Decision) String() string {
	switch d {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case DeadLetter:
		return "dead-letter"
	}
	return "decision(" + strconv.Itoa(int(d)) + ")"
}

// Settlement is what became of one delivery.
type Settlement struct {
	Message  *Message
	Decision Decision
	// Delay is a Nak's delay before the next delivery.
	Delay time.Duration
	// Answer is the protocol's answer to the message.
	Answer idempotency.Answer
	// Reason is a DeadLetter's ReasonHeader.
	Reason string
	// Err is the broker's failure to settle as decided: a failed reply
	// or dead letter turns the decision into a Nak; a failed Ack or Nak
	// leaves the message to the broker, which delivers it again.
	Err error
	// ReplyErr is the reply that was lost for good: the broker refused it
	// permanently (it wraps ErrUndeliverable), so the message was settled
	// as decided all the same, since delivering it again could only lose
	// the reply again. Nil when the reply was published, or none was
	// asked for.
	ReplyErr error
}

// settleTimeout bounds one settlement's broker calls.
const settleTimeout = 30 * time.Second

// decide maps the protocol's answer to a decision:
//
//   - the run's 2xx or 3xx (committed) or final refusal (recorded), or a
//     replay of the record: Ack, with the answer as the reply;
//   - the protocol's problem that says when to retry (another consumer
//     holds the key, the database or its COMMIT failed), or the run's
//     503 or Retry-After (the handler met such a fault): Nak after
//     RetryDelay; never Ack, never dead-lettered, whatever the delivery;
//   - the handler's failure (a non-final status, a panic, an answer too
//     large to record, an abort): Nak after Backoff, or DeadLetter
//     (ReasonMaxDeliveries) on the MaxDeliveries-th delivery;
//   - any other problem (bad input, the key reused with another payload):
//     DeadLetter, with the problem as the reason and the reply.
func (p *Processor) decide(m *Message, ans idempotency.Answer) Settlement {
	s := Settlement{Message: m, Answer: ans}
	switch pr := ans.Problem; {
	case pr != nil && pr.RetryAfter > 0:
		s.Decision, s.Delay = Nak, p.cfg.RetryDelay
	case pr != nil && pr.Status >= 500, ans.Abort != nil:
		p.failed(&s)
	case pr != nil:
		s.Decision, s.Reason = DeadLetter, pr.Kind()
	case ans.Replayed, ans.Status >= 200 && ans.Status < 400, ans.Status >= 400 && p.isFinal(ans.Status):
		s.Decision = Ack
	case ans.Status == 503 || len(ans.Header["Retry-After"]) > 0:
		// The handler met a fault of the infrastructure (the database
		// failed for a moment) and said so: not its failure.
		s.Decision, s.Delay = Nak, p.cfg.RetryDelay
	default:
		p.failed(&s)
	}
	return s
}

// failed decides for a handler's failure.
func (p *Processor) failed(s *Settlement) {
	delivery := max(s.Message.Delivery, 1)
	if delivery >= p.cfg.MaxDeliveries {
		s.Decision, s.Reason = DeadLetter, ReasonMaxDeliveries
		return
	}
	s.Decision, s.Delay = Nak, p.cfg.Backoff.Delay(delivery)
}

// settle carries a decision out with the broker: the reply first, when
// the message asked for one and the decision is final, then the
// settlement. A reply or a dead letter that the broker did not take makes
// it a Nak: the next delivery replays the record and replies again. A
// reply the broker refuses for good (ErrUndeliverable) does not: no
// delivery could ever settle the message, which would replay for ever.
func (p *Processor) settle(ctx context.Context, d Delivery, s Settlement) {
	if p.cfg.BeforeSettle != nil {
		p.cfg.BeforeSettle(s)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	m := s.Message
	if s.Decision != Nak && m.ReplyTo != "" {
		switch err := d.Reply(ctx, replyOf(s.Answer)); {
		case errors.Is(err, ErrUndeliverable):
			p.cfg.Logger.Warn("queue: reply lost for good; settling the message as decided", "source", m.Source,
				"reply_to", m.ReplyTo, "decision", s.Decision.String(), "err", err)
			s.ReplyErr = err
		case err != nil:
			p.cfg.Logger.Warn("queue: reply not published; delivering the message again", "source", m.Source, "reply_to", m.ReplyTo, "err", err)
			s.Decision, s.Delay, s.Err = Nak, p.cfg.RetryDelay, err
		}
	}
	switch s.Decision {
	case Ack:
		s.Err = d.Ack(ctx)
	case DeadLetter:
		if err := d.DeadLetter(ctx, deadLetterHeader(s)); err != nil {
			p.cfg.Logger.Warn("queue: dead letter not stored; delivering the message again", "source", m.Source, "reason", s.Reason, "err", err)
			s.Decision, s.Delay, s.Err = Nak, p.cfg.RetryDelay, err
			_ = d.Nak(ctx, s.Delay)
			break
		}
		p.cfg.Logger.Warn("queue: message dead-lettered", "source", m.Source, "reason", s.Reason,
			"status", statusOf(s.Answer), "delivery", m.Delivery)
	case Nak:
		if err := d.Nak(ctx, s.Delay); err != nil && s.Err == nil {
			s.Err = err
		}
	}
	if s.Err != nil {
		p.cfg.Logger.Warn("queue: settling failed; the broker delivers the message again", "source", m.Source,
			"decision", s.Decision.String(), "err", s.Err)
	}
	if p.cfg.Observe != nil {
		p.cfg.Observe(s)
	}
}

// replyOf is the answer as a reply: the run's or the record's answer, or
// the protocol's problem as application/problem+json.
func replyOf(ans idempotency.Answer) Reply {
	if pr := ans.Problem; pr != nil {
		body, _ := json.Marshal(pr)
		return Reply{Status: pr.Status, Header: map[string][]string{"Content-Type": {"application/problem+json"}}, Body: body}
	}
	return Reply{Status: ans.Status, Header: ans.Header, Body: ans.Body, Replayed: ans.Replayed}
}

func statusOf(ans idempotency.Answer) int {
	if ans.Problem != nil {
		return ans.Problem.Status
	}
	return ans.Status
}

// maxDetail bounds the DetailHeader: enough for a problem's title and
// detail, never a whole body.
const maxDetail = 512

// deadLetterHeader is the reason a message is dead-lettered, as headers.
func deadLetterHeader(s Settlement) map[string]string {
	h := map[string]string{
		ReasonHeader:     s.Reason,
		DeadStatusHeader: strconv.Itoa(statusOf(s.Answer)),
		DetailHeader:     detailOf(s.Answer),
		DeliveriesHeader: strconv.Itoa(s.Message.Delivery),
		SourceHeader:     s.Message.Source,
	}
	if s.Message.ID != "" {
		h[MessageIDHeader] = s.Message.ID
	}
	return h
}

// detailOf is an answer's problem, "title: detail", or its body's start,
// on one line.
func detailOf(ans idempotency.Answer) string {
	text := ""
	switch {
	case ans.Problem != nil:
		text = ans.Problem.Error()
	case isProblem(ans.Header):
		var pr idempotency.Problem
		if json.Unmarshal(ans.Body, &pr) == nil {
			text = pr.Error()
		}
	}
	if text == "" {
		text = string(ans.Body)
	}
	text = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, text)
	if len(text) > maxDetail {
		text = strings.ToValidUTF8(text[:maxDetail], "")
	}
	return strings.TrimSpace(text)
}

func isProblem(h map[string][]string) bool {
	v := h["Content-Type"]
	if len(v) == 0 {
		return false
	}
	mt, _, _ := mime.ParseMediaType(v[0])
	return mt == "application/problem+json"
}
