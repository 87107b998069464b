// Package logcount is an slog.Handler for tests under load: it counts the
// warnings and errors logged, by message and cause, so that a failing test
// says why answers failed without printing thousands of lines.
package logcount

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

// Causes counts the records at slog.LevelWarn and above by their message
// with their err, status and release_err attributes.
type Causes struct {
	mu     sync.Mutex
	counts map[string]int
}

// New returns an empty count.
func New() *Causes { return &Causes{counts: map[string]int{}} }

func (c *Causes) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (c *Causes) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" || a.Key == "status" || a.Key == "release_err" {
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	if len(line) > 400 {
		line = line[:400] + "…"
	}
	c.mu.Lock()
	c.counts[line]++
	c.mu.Unlock()
	return nil
}

func (c *Causes) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *Causes) WithGroup(string) slog.Handler      { return c }

// Log prints at most most kinds of record, the most frequent first, each
// line after prefix.
func (c *Causes) Log(t testing.TB, prefix string, most int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := make([]string, 0, len(c.counts))
	for l := range c.counts {
		lines = append(lines, l)
	}
	slices.SortFunc(lines, func(x, y string) int { return c.counts[y] - c.counts[x] })
	for i, l := range lines {
		if i == most {
			t.Logf("  %s: %d more kinds of warning", prefix, len(lines)-i)
			break
		}
		t.Logf("  %s ×%d: %s", prefix, c.counts[l], l)
	}
}

// CaptureDefault sends slog's default logger to c until t ends.
func CaptureDefault(t testing.TB, c *Causes) {
	prev := slog.Default()
	slog.SetDefault(slog.New(c))
	t.Cleanup(func() { slog.SetDefault(prev) })
}
