package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/orderguard/idempotency"
)

// Processor does delivered messages under the protocol and settles each
// with its broker. The broker front-ends (idemnats, idemamqp) create one
// and feed it their deliveries.
type Processor struct {
	cfg         Config
	mw          *idempotency.Middleware
	method      string
	route       string
	fingerprint idempotency.JSONFingerprintFunc
	maxBody     int64
	isFinal     func(int) bool
}

// New returns a Processor of the messages from source (a subject or a
// queue: the default Route's name) with cfg.
func New(source string, cfg Config) (*Processor, error) {
	cfg = cfg.withDefaults(source)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Processor{cfg: cfg, mw: cfg.Middleware, fingerprint: idempotency.NewJSONFingerprint(cfg.Fingerprint),
		maxBody: 1 << 20, isFinal: idempotency.DefaultIsFinal}
	p.method, p.route, _ = strings.Cut(cfg.Route, " ")
	if p.mw != nil {
		p.maxBody, p.isFinal = p.mw.Config().MaxBodyBytes, p.mw.Config().IsFinalFunc
		if p.mw.Config().Operation != nil {
			// The action as declared once: the payload is its parameters.
			p.fingerprint = func(_, _ string, params []byte) (string, error) { return p.mw.FingerprintJSON(params) }
		}
	}
	return p, nil
}

// Config returns the processor's configuration with its defaults applied.
func (p *Processor) Config() Config { return p.cfg }

// Run does the deliveries that arrive on in, Config.Workers batches at a
// time, each batch what in holds at once up to Config.BatchSize, until in
// is closed or ctx ends. It returns when every delivery it took is
// settled; deliveries left in in are not touched.
func (p *Processor) Run(ctx context.Context, in <-chan Delivery) {
	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() {
			for {
				batch := p.take(ctx, in)
				if len(batch) == 0 {
					return
				}
				p.Process(ctx, batch)
			}
		})
	}
	wg.Wait()
}

// take waits for a delivery, then takes those that are waiting behind it,
// up to Config.BatchSize: a batch never waits to fill. Once ctx has ended
// it takes nothing more, even with deliveries waiting (select would pick
// among ready cases at random): those are the front-end's to hand back.
func (p *Processor) take(ctx context.Context, in <-chan Delivery) []Delivery {
	if ctx.Err() != nil {
		return nil
	}
	var batch []Delivery
	select {
	case <-ctx.Done():
		return nil
	case d, ok := <-in:
		if !ok {
			return nil
		}
		batch = append(batch, d)
	}
	for len(batch) < p.cfg.BatchSize && ctx.Err() == nil {
		select {
		case d, ok := <-in:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		default:
			return batch
		}
	}
	return batch
}

// Process does a batch of deliveries (one or more) and settles each: each
// message's action read from it (key, scope, fingerprint), then the
// protocol, one by one (Do) or in one transaction (DoBatch), then each
// message acked, negatively acked or dead-lettered by its answer
// (decide), its reply published first when it asked for one. Its run is
// committed before any of that.
func (p *Processor) Process(ctx context.Context, ds []Delivery) {
	if p.cfg.Unprotected != nil {
		p.processUnprotected(ctx, ds)
		return
	}
	answers := make([]idempotency.Answer, len(ds))
	var batch []idempotency.BatchAction
	var at []int
	for i, d := range ds {
		m := d.Message()
		action, err := p.action(m)
		if err != nil {
			answers[i] = p.mw.Reject(ctx, err)
			continue
		}
		batch = append(batch, idempotency.BatchAction{Action: action, Run: p.run(m)})
		at = append(at, i)
	}
	switch len(batch) {
	case 0:
	case 1:
		answers[at[0]] = p.mw.Do(ctx, batch[0].Action, batch[0].Run)
	default:
		for j, a := range p.mw.DoBatch(ctx, batch) {
			answers[at[j]] = a
		}
	}
	for i, d := range ds {
		m, ans := d.Message(), answers[i]
		if p.cfg.KeyReusedFunc != nil && ans.Problem != nil && ans.Problem.Kind() == idempotency.ProblemKeyReused {
			p.settle(ctx, d, p.keyReused(ctx, m, ans))
			continue
		}
		p.settle(ctx, d, p.decide(m, ans))
	}
}

// keyReused decides for a message refused as its key reused with another
// payload, by Config.KeyReusedFunc's answer: a fault of its is the
// infrastructure's, a Nak after RetryDelay.
func (p *Processor) keyReused(ctx context.Context, m *Message, refused idempotency.Answer) Settlement {
	ans, err := p.cfg.KeyReusedFunc(ctx, m, refused)
	if err != nil {
		p.cfg.Logger.Warn("queue: a message whose key was reused was not taken; delivering it again", "source", m.Source, "err", err)
		return Settlement{Message: m, Answer: refused, Decision: Nak, Delay: p.cfg.RetryDelay}
	}
	return p.decide(m, ans)
}

// run is a message's action as the protocol runs it: the handler in the
// record's transaction.
func (p *Processor) run(m *Message) idempotency.RunFunc {
	return func(ctx context.Context) idempotency.Result {
		tx, _ := idempotency.TxFromContext(ctx)
		return p.cfg.Handler(ctx, tx, m)
	}
}

// action reads a message's action in the order an HTTP request's is read:
// the application's checks in front (Validate), 1. the key, 2. the scope,
// 3. the fingerprint over the payload, within the body limit. An error is
// the protocol's refusal (Middleware.Reject).
func (p *Processor) action(m *Message) (idempotency.Action, error) {
	if int64(len(m.Body)) > p.maxBody {
		return idempotency.Action{}, fmt.Errorf("%w: a %d-byte message, limit %d", idempotency.ErrBodyTooLarge, len(m.Body), p.maxBody)
	}
	if p.cfg.Validate != nil {
		if err := p.cfg.Validate(m); err != nil {
			return idempotency.Action{}, asRefusal(err)
		}
	}
	key, err := p.cfg.Key(m)
	if err != nil {
		return idempotency.Action{}, err
	}
	scope, err := p.cfg.Scope(m)
	if err != nil {
		return idempotency.Action{}, scopeProblem(err)
	}
	var fp string
	if p.cfg.FingerprintFunc != nil {
		fp, err = p.cfg.FingerprintFunc(m)
	} else {
		fp, err = p.fingerprint(p.method, p.route, m.Body)
	}
	if err != nil {
		return idempotency.Action{}, asRefusal(err)
	}
	return idempotency.Action{Scope: scope, Key: key, Fingerprint: fp}, nil
}

// asRefusal keeps a *Problem and the protocol's input errors, and makes
// any other error invalid-body: a check that refuses a message refuses its
// input, never reports a fault to retry.
func asRefusal(err error) error {
	var p *idempotency.Problem
	for _, known := range []error{idempotency.ErrInvalidBody, idempotency.ErrBodyTooLarge,
		idempotency.ErrUnsupportedMediaType, idempotency.ErrInvalidKey, idempotency.ErrMissingKey} {
		if errors.Is(err, known) {
			return err
		}
	}
	if errors.As(err, &p) {
		return err
	}
	return fmt.Errorf("%w: %v", idempotency.ErrInvalidBody, err)
}
