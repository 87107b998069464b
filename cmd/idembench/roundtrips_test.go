package main

import (
	"testing"

	"github.com/orderguard/idempotency"
)

// Round trips per request on the MariaDB families' pools, as the report
// counts them (at the network connection): the bare create is BEGIN, the
// price SELECT, the INSERT, the guarded UPDATE and COMMIT; single-phase's
// record INSERT travels with the COMMIT on idempotency.OpenMySQL's pool, so
// a new key costs B0's round trips; claim-first adds the claim and the
// finish (the root package's TestRoundTrips_MariaDB_PerRequest_ModeAndPath
// specifies the same). It needs a MariaDB server: skipped without one,
// except in CI.
func TestRoundTrips_MariaDBFamily_SinglePhaseCostsB0ClaimFirstTwoMore(t *testing.T) {
	t.Parallel()
	opts, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := testMariaDB(t, opts, "test_trips")
	// perRequest sends n requests through t after warm (single-phase reads
	// the record first until its first decision, 256 requests in) and
	// returns the round trips per measured request.
	perRequest := func(t0 target, warm, n int) float64 {
		t.Helper()
		w := newWorker(0)
		send := func() {
			if _, err := w.do(f.client, t0, t0.gen(w)); err != nil {
				t.Fatal(err)
			}
		}
		for range warm {
			send()
		}
		before := f.probe()["round_trips"]
		for range n {
			send()
		}
		return (f.probe()["round_trips"] - before) / float64(n)
	}
	base, err := f.baselineTarget()
	if err != nil {
		t.Fatal(err)
	}
	b0 := perRequest(base, 2, 20)
	if b0 != 5 {
		t.Fatalf("B0: %.2f round trips per request, want 5 (BEGIN, SELECT, INSERT, UPDATE, COMMIT)", b0)
	}
	for _, tc := range []struct {
		mode idempotency.Mode
		warm int
		want float64
	}{
		{idempotency.ModeSinglePhase, 300, b0},
		{idempotency.ModeClaimFirst, 2, b0 + 2},
	} {
		first, err := f.firstTarget(idempotency.Config{Mode: tc.mode})
		if err != nil {
			t.Fatal(err)
		}
		if got := perRequest(first, tc.warm, 20); got != tc.want {
			t.Errorf("B1 %s: %.2f round trips per request, want %.0f", modeName(tc.mode), got, tc.want)
		}
	}
}
