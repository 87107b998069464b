package main

// Where the fleet family's replays were answered from, and its Redis calls:
// counters the fleet's probes add to every point.

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/orderguard/idempotency"
	idemredis "github.com/orderguard/idempotency/redis"
)

// replaySources counts where the create route's replays were answered from:
// this instance's replay cache (Event.From), the shared cache (Redis: the
// request's GetReplay found the entry, sharedCounter), the store after a
// read, or the store after an execution that collided and rolled back (a
// StageExecute began in the same request). It is both Observer and
// StageObserver.
type replaySources struct {
	cache, shared, store, reexec, executed atomic.Int64
}

type requestMarks struct{ executed, shared atomic.Bool }

type marksKey struct{}

func (s *replaySources) StartStage(ctx context.Context, st idempotency.Stage, route string) (context.Context, func(idempotency.StageEnd)) {
	switch st {
	case idempotency.StageRequest:
		ctx = context.WithValue(ctx, marksKey{}, &requestMarks{})
	case idempotency.StageExecute:
		if m, ok := ctx.Value(marksKey{}).(*requestMarks); ok && route == "create_order" {
			m.executed.Store(true)
			s.executed.Add(1)
		}
	}
	return ctx, func(idempotency.StageEnd) {}
}

func (s *replaySources) Observe(ctx context.Context, e idempotency.Event) {
	if !e.Final || e.Outcome != idempotency.OutcomeReplayed || e.Route != "create_order" {
		return
	}
	m, _ := ctx.Value(marksKey{}).(*requestMarks)
	switch {
	case e.From == idempotency.ReplayFromCache:
		s.cache.Add(1)
	case m != nil && m.shared.Load() && !m.executed.Load():
		s.shared.Add(1)
	case m != nil && m.executed.Load():
		s.reexec.Add(1)
	default:
		s.store.Add(1)
	}
}

// probe adds the counters to a load probe: runLoad reports them per request.
func (s *replaySources) probe(base func() map[string]float64) func() map[string]float64 {
	return func() map[string]float64 {
		out := base()
		out["replay_from_cache"] = float64(s.cache.Load())
		out["replay_from_redis"] = float64(s.shared.Load())
		out["replay_from_store"] = float64(s.store.Load())
		out["replay_reexecuted"] = float64(s.reexec.Load())
		out["handler_runs"] = float64(s.executed.Load())
		return out
	}
}

// sourceShares is where a point's replays came from, in % of its replays:
// this instance's cache / Redis / the store / a re-execution.
func sourceShares(p *Point) string {
	c, rd, s, x := p.Server["replay_from_cache"], p.Server["replay_from_redis"], p.Server["replay_from_store"], p.Server["replay_reexecuted"]
	all := c + rd + s + x
	if all == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f %%", 100*c/all, 100*rd/all, 100*s/all, 100*x/all)
}

// redisCallsProbe adds the caches' failed and skipped calls and their
// downs to a probe (per request in the point, as every probe value).
func redisCallsProbe(caches []*idemredis.Cache, base func() map[string]float64) func() map[string]float64 {
	return func() map[string]float64 {
		out := base()
		s := redisStats(caches)
		out["redis_failed"] = float64(s.Errors)
		out["redis_skipped"] = float64(s.Skipped)
		out["redis_downs"] = float64(s.Downs)
		return out
	}
}

// redisCalls is the point's failed and skipped Redis calls and downs, for a
// point with Redis ("" for one without).
func redisCalls(p *Point) string {
	if _, ok := p.Server["redis_failed"]; !ok {
		return ""
	}
	n := float64(p.Requests)
	return fmt.Sprintf("; Redis calls failed %.0f, skipped %.0f, down %.0f times",
		p.Server["redis_failed"]*n, p.Server["redis_skipped"]*n, p.Server["redis_downs"]*n)
}
