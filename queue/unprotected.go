package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/orderguard/idempotency"
)

// processUnprotected is Process without the protocol (Config.Unprotected):
// the consumer most services run, acking after its own commit and doing a
// redelivered message again. A batch commits in one transaction, or, when
// one of its runs does not answer a 2xx, is rolled back and done one by
// one, as a protected batch is.
func (p *Processor) processUnprotected(ctx context.Context, ds []Delivery) {
	// The application's own checks hold without the protocol too: a
	// refused message is dead-lettered, never run.
	var run []Delivery
	for _, d := range ds {
		if pr := p.refuse(d.Message()); pr != nil {
			p.settle(ctx, d, p.decide(d.Message(), idempotency.Answer{Problem: pr}))
			continue
		}
		run = append(run, d)
	}
	answers, ok := []idempotency.Answer(nil), false
	if len(run) > 1 {
		answers, ok = p.unprotectedBatch(ctx, run)
	}
	if !ok {
		answers = make([]idempotency.Answer, len(run))
		for i, d := range run {
			answers[i] = p.unprotectedOne(ctx, d)
		}
	}
	for i, d := range run {
		p.settle(ctx, d, p.decide(d.Message(), answers[i]))
	}
}

// refuse is the body limit and Validate without the protocol: the
// problem that refuses m, or nil.
func (p *Processor) refuse(m *Message) *idempotency.Problem {
	var err error
	switch {
	case int64(len(m.Body)) > p.maxBody:
		return idempotency.NewProblem(http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge,
			"Request body too large", fmt.Sprintf("a %d-byte message, limit %d", len(m.Body), p.maxBody))
	case p.cfg.Validate != nil:
		err = p.cfg.Validate(m)
	}
	if err == nil {
		return nil
	}
	var pr *idempotency.Problem
	if errors.As(err, &pr) {
		return pr
	}
	return idempotency.NewProblem(http.StatusBadRequest, idempotency.ProblemInvalidBody, "Invalid request body", err.Error())
}

func (p *Processor) unprotectedOne(ctx context.Context, d Delivery) idempotency.Answer {
	answers, _ := p.unprotectedBatch(ctx, []Delivery{d})
	return answers[0]
}

// unprotectedBatch runs ds in one plain transaction and commits it when
// every run answered a 2xx or 3xx. It reports false, having rolled back,
// when a batch of several did not; a single message gets its answer.
func (p *Processor) unprotectedBatch(ctx context.Context, ds []Delivery) ([]idempotency.Answer, bool) {
	answers := make([]idempotency.Answer, len(ds))
	tx, err := p.cfg.Unprotected.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		answers[0] = faultAnswer(err)
		return answers, false
	}
	for i, d := range ds {
		r := p.runUnprotected(ctx, tx, d.Message())
		answers[i] = idempotency.Answer{Status: r.Status, Header: r.Header, Body: r.Body}
		if r.Status < 200 || r.Status > 399 {
			_ = tx.Rollback()
			return answers, len(ds) == 1
		}
	}
	if err := tx.Commit(); err != nil {
		// The outcome is unknown, and nothing here finds it out: the
		// next delivery runs again, as an unprotected consumer does.
		for i := range answers {
			answers[i] = faultAnswer(err)
		}
		return answers, true
	}
	return answers, true
}

// runUnprotected runs the handler, a panic answered 500.
func (p *Processor) runUnprotected(ctx context.Context, tx *sql.Tx, m *Message) (r idempotency.Result) {
	defer func() {
		if v := recover(); v != nil {
			r = idempotency.Result{Status: http.StatusInternalServerError, Body: fmt.Appendf(nil, "panic: %v", v)}
		}
	}()
	return p.cfg.Handler(ctx, tx, m)
}

func faultAnswer(err error) idempotency.Answer {
	pr := idempotency.NewProblem(http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable, "Database unavailable", err.Error())
	pr.RetryAfter = 1
	return idempotency.Answer{Problem: pr}
}
