package logcount

import (
	"errors"
	"log/slog"
	"testing"
)

func TestCauses_CountsWarningsByMessageAndCause_NotInfo(t *testing.T) {
	c := New()
	log := slog.New(c)
	log.Info("listening")
	log.Warn("claim failed", "err", errors.New("deadlock"), "key", "k1")
	log.Warn("claim failed", "err", errors.New("deadlock"), "key", "k2")
	log.Error("claim failed", "err", errors.New("lock wait timeout"))
	want := map[string]int{"claim failed err=deadlock": 2, "claim failed err=lock wait timeout": 1}
	if len(c.counts) != len(want) {
		t.Fatalf("counts = %v, want %v", c.counts, want)
	}
	for line, n := range want {
		if c.counts[line] != n {
			t.Errorf("counts[%q] = %d, want %d", line, c.counts[line], n)
		}
	}
}
