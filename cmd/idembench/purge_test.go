package main

import (
	"context"
	"testing"
)

// B4's purge points rest on two things a wrong load or a wrong purge loop
// would break without failing the run: the expired records bulkLoad makes
// are exactly what Purge deletes (the live ones stay), and the background
// purge reports what it did, running out when nothing expired is left. It
// needs a MariaDB server: skipped without one, except in CI.
func TestB4Purge_DeletesTheExpiredLoadAndNothingLive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := testMariaDB(t, opts, "test_purge")
	const live, expired = 3000, 2500 // 2500: two full batches and a short one
	if _, err := bulkLoad(ctx, f.db, live, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := bulkLoad(ctx, f.db, expired, 2, true); err != nil {
		t.Fatal(err)
	}

	pg := &purging{store: f.store}
	pg.start(ctx)
	<-pg.done // it stops by itself once a batch comes back short
	pg.stop()
	pt := pg.timing(live, expired, "test")

	if pt.Error != "" || !pt.RanOut || pt.Deleted != expired || pt.Batches != 3 {
		t.Fatalf("purge: %+v; want all %d expired records deleted in 3 batches, ran out, no error", pt, expired)
	}
	var left int64
	if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idempotency_record").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != live {
		t.Fatalf("%d records left, want the %d live ones", left, live)
	}
}
