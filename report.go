package idempotency

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"time"
)

// note reports a step outcome.
func (a *attempt) note(e Event) {
	e.Route, e.KeyHash = a.m.cfg.Route, a.keyHash
	a.m.cfg.Observer.Observe(a.ctx, e)
}

// done reports the request's final outcome and ends its stage.
func (a *attempt) done(e Event) {
	e.Duration, e.Final = time.Since(a.start), true
	a.outcome = e.Outcome
	a.note(e)
	a.endRequest(StageEnd{Outcome: e.Outcome, Err: e.Err, Record: e.Replayed, KeyHash: a.keyHash})
}

// startStage begins a stage if the Observer traces stages.
func (m *Middleware) startStage(ctx context.Context, s Stage) (context.Context, func(StageEnd)) {
	if so, ok := m.cfg.Observer.(StageObserver); ok {
		return so.StartStage(ctx, s, m.cfg.Route)
	}
	return ctx, func(StageEnd) {}
}

// log writes one structured line per notable decision, with the key hashed.
func (m *Middleware) log(level slog.Level, msg, keyHash string, args ...any) {
	if !m.cfg.Logger.Enabled(context.Background(), level) {
		return
	}
	args = append([]any{"route", m.cfg.Route, "key_hash", keyHash}, args...)
	m.cfg.Logger.Log(context.Background(), level, "idempotency: "+msg, args...)
}

// newOwner is the lease owner of one attempt: the instance id plus a random
// token, so that two attempts of one process never share a lease.
func (m *Middleware) newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return m.cfg.InstanceID + "/" + hex.EncodeToString(b[:])
}

// KeyHash is the short, stable hash of a scope and key used in logs, metrics
// and traces instead of the raw key, which may be sensitive: the first 16 hex
// digits of SHA-256 over both, length-prefixed.
func KeyHash(scope, key string) string {
	var stack [8 + 2*255]byte // every request's key and scope fit: no allocation
	in := binary.BigEndian.AppendUint64(stack[:0], uint64(len(scope)))
	in = append(append(in, scope...), key...)
	sum := sha256.Sum256(in)
	return hex.EncodeToString(sum[:8])
}
