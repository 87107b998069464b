package main

import (
	"regexp"
	"slices"
	"testing"
	"time"
)

var uuidForm = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-([0-9a-f])[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Both kinds are RFC 9562 UUIDs of their version.
func TestKeyKinds_AreUUIDsOfTheirVersion(t *testing.T) {
	for _, c := range []struct {
		make    func() string
		version string
	}{{newKeyV4, "4"}, {newKeyV7, "7"}} {
		k := c.make()
		m := uuidForm.FindStringSubmatch(k)
		if m == nil || m[1] != c.version {
			t.Fatalf("%q is not a UUIDv%s", k, c.version)
		}
	}
}

// A UUIDv7 starts with its millisecond timestamp, so later keys sort later,
// also within one millisecond.
func TestKeyV7_SortsByTime(t *testing.T) {
	t0 := time.UnixMilli(1767225600000) // 2026-01-01 00:00:00 UTC = 0x019b76da_a800
	if k := newKeyV7At(t0); k[:13] != "019b76da-a800" {
		t.Fatalf("key at %v starts %q, want 019b76da-a800", t0, k[:13])
	}
	var keys []string
	for i := range 50 {
		keys = append(keys, newKeyV7At(t0.Add(time.Duration(i)*300*time.Microsecond)))
	}
	if !slices.IsSorted(keys) {
		t.Fatalf("keys made later do not sort later: %q", keys)
	}
}

// B4's key kinds are compared at each level through their own B0s.
func TestKeyKindRatios_TimeOrderedOverRandomEachThroughItsB0(t *testing.T) {
	pts := []*Point{
		{Bench: "B4:B1", Variant: "claim-first, " + keysRandom.name, Records: 10, Concurrency: 16, RPS: 500, BaselineRPS: 1000, P99: 40, BaselineP99: 20},
		{Bench: "B4:B1", Variant: "claim-first, " + keysTimeOrdered.name, Records: 10, Concurrency: 16, RPS: 900, BaselineRPS: 1200, P99: 30, BaselineP99: 20},
		{Bench: "B4:B1", Variant: "single-phase, " + keysRandom.name, Records: 10, Concurrency: 16, RPS: 900, BaselineRPS: 1200},
	}
	rs := keyKindRatios(pts)
	if len(rs) != 2 {
		t.Fatalf("%d ratios, want 2 (throughput and P99 of claim-first): %+v", len(rs), rs)
	}
	if thr, p99 := rs[0].Value, rs[1].Value; thr != 1.5 || p99 != 0.75 || !rs[0].Headline {
		t.Fatalf("throughput %v (want (900/1200)/(500/1000) = 1.5), P99 %v (want 0.75), headline %v", thr, p99, rs[0].Headline)
	}
}
