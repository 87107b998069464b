package clustertest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// fencingBundle is two attempts on one key: A on node 1, whose lease
// expires, and B on node 2, which takes the key over.
type fencingBundle struct {
	c              *cluster
	store1, store2 *idempotency.SQLStore
	key            string
	claimA         idempotency.Claim
	leaseA         idempotency.Lease
}

const fencingLease = time.Second

func setupFencing(t *testing.T) *fencingBundle {
	t.Helper()
	c := newCluster(t)
	b := &fencingBundle{
		c:      c,
		store1: idempotency.NewMySQLStore(c.app[1]),
		store2: idempotency.NewMySQLStore(c.app[2]),
		key:    newKey("fence"),
	}
	b.claimA = idempotency.Claim{
		Scope: scope, Key: b.key, Fingerprint: "fp", Owner: "node1/attempt-a",
		Lease: fencingLease, Retention: time.Hour,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	b.leaseA, err = b.store1.Claim(ctx, b.claimA)
	require.NoError(t, err)
	return b
}

// expiredOnNode2 waits until node 2 sees A's claim with its lease expired,
// by the database's clock, and returns the record.
func (b *fencingBundle) expiredOnNode2(t *testing.T) *idempotency.Record {
	t.Helper()
	deadline := time.Now().Add(10 * fencingLease)
	for {
		rec, err := b.store2.Lookup(context.Background(), scope, b.key)
		if err == nil && rec.LeaseExpired {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 2 never saw A's lease expire: %+v, %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeOver is attempt B: node 2 takes the expired claim over.
func (b *fencingBundle) takeOver(t *testing.T, rec *idempotency.Record) idempotency.Lease {
	t.Helper()
	claimB := b.claimA
	claimB.Owner, claimB.Lease = "node2/attempt-b", time.Minute
	leaseB, err := b.store2.TakeOver(context.Background(), claimB, idempotency.Lease{Owner: rec.Owner, Version: rec.Version})
	require.NoError(t, err, "B's takeover on node 2")
	return leaseB
}

// order is the order an attempt would create for the key.
func (b *fencingBundle) order(no string) *idempotency.Order {
	return &idempotency.Order{
		OrderNo: no, Scope: scope, IdempotencyKey: b.key, UserID: userID,
		SKUID: orderservice.FirstSKU, Quantity: 1, UnitPriceCents: 1000, TotalCents: 1000,
	}
}

func snapshot(orderNo string) *idempotency.Snapshot {
	return &idempotency.Snapshot{StatusCode: http.StatusCreated, Header: http.Header{}, Body: []byte(`{"order_no":"` + orderNo + `"}`)}
}

// requireHeldBy checks, with a causal read on every node, that the key's
// record is owned by lease at its version, and that the key's only order
// (if want is not empty) is want.
func (b *fencingBundle) requireHeldBy(t *testing.T, lease idempotency.Lease, status idempotency.Status, wantOrder string) {
	t.Helper()
	for _, n := range b.c.nodes() {
		var owner, st string
		var version int64
		require.NoError(t, b.c.check[n].QueryRow(
			`SELECT locked_by, lease_version, status FROM idempotency_record WHERE scope = ? AND idempotency_key = ?`,
			scope, b.key).Scan(&owner, &version, &st), "node %d", n)
		if owner != lease.Owner || version != lease.Version || st != string(status) {
			t.Errorf("node %d: record held by %s v%d %s; want %s v%d %s", n, owner, version, st, lease.Owner, lease.Version, status)
		}
		orders := b.c.orders(t, n, scope)
		switch r, ok := orders[b.key]; {
		case wantOrder == "" && ok:
			t.Errorf("node %d holds order %s for the key; want none", n, r.orderNo)
		case wantOrder != "" && (!ok || r.orderNo != wantOrder || r.count != 1):
			t.Errorf("node %d holds %+v for the key; want order %s", n, r, wantOrder)
		}
	}
}

// TestFencing_TakeoverOnAnotherNode_FencesOldLease: attempt A claims a key
// on node 1, its lease expires, and attempt B takes the key over on node 2.
// A's lease is then lost on node 1 too: it can neither finish, release nor
// extend the claim, nor commit an order under it, and B finishes normally.
func TestFencing_TakeoverOnAnotherNode_FencesOldLease(t *testing.T) {
	t.Run("old lease used after the takeover", func(t *testing.T) {
		b := setupFencing(t)
		before := b.c.conflicts(t)
		leaseB := b.takeOver(t, b.expiredOnNode2(t))
		ctx := context.Background()

		// Node 1 may not have applied B's takeover yet: then A's statement
		// matches locally and fails certification at COMMIT (1213), which
		// the store retries until it matches nothing. Either way: lost.
		_, err := b.store1.Finish(ctx, b.leaseA, idempotency.StatusDone, snapshot("A"), time.Hour)
		errIs(t, err, idempotency.ErrLeaseLost, "A's Finish on node 1")
		err = b.store1.Release(ctx, b.leaseA)
		errIs(t, err, idempotency.ErrLeaseLost, "A's Release on node 1")
		_, err = b.store1.Extend(ctx, b.leaseA, time.Minute)
		errIs(t, err, idempotency.ErrLeaseLost, "A's Extend on node 1")

		tx, err := b.store1.BeginTx(ctx)
		require.NoError(t, err)
		require.NoError(t, idempotency.CreateOrder(ctx, tx, b.order("OA1")))
		_, err = b.store1.FinishTx(ctx, tx, b.leaseA, idempotency.StatusDone, snapshot("OA1"), time.Hour)
		errIs(t, err, idempotency.ErrLeaseLost, "A's FinishTx in its business transaction on node 1")
		require.NoError(t, tx.Rollback(), "A rolls back on a lost lease, as the middleware does")
		b.requireHeldBy(t, leaseB, idempotency.StatusProcessing, "")

		// B finishes on node 2 with its order.
		tx, err = b.store2.BeginTx(ctx)
		require.NoError(t, err)
		require.NoError(t, idempotency.CreateOrder(ctx, tx, b.order("OB1")))
		doneB, err := b.store2.FinishTx(ctx, tx, leaseB, idempotency.StatusDone, snapshot("OB1"), time.Hour)
		require.NoError(t, err, "B's FinishTx on node 2")
		require.NoError(t, tx.Commit(), "B's commit on node 2")
		b.requireHeldBy(t, doneB, idempotency.StatusDone, "OB1")
		t.Logf("fencing, old lease after takeover: A's four fenced calls on node 1 lost; galera conflicts: %s", b.c.conflictsSince(t, before))
	})

	t.Run("finished before the takeover, committed after", func(t *testing.T) {
		// A's transaction on node 1 creates its order and finishes the record
		// (its lease matches there: B has not come yet), but has not
		// committed when B takes over on node 2. On one server B's takeover
		// would wait for A's row lock and then find the lease moved on; on
		// Galera, B's takeover commits first and A's COMMIT must fail.
		b := setupFencing(t)
		before := b.c.conflicts(t)
		ctx := context.Background()
		b.expiredOnNode2(t)

		tx, err := b.store1.BeginTx(ctx)
		require.NoError(t, err)
		require.NoError(t, idempotency.CreateOrder(ctx, tx, b.order("OA2")))
		_, err = b.store1.FinishTx(ctx, tx, b.leaseA, idempotency.StatusDone, snapshot("OA2"), time.Hour)
		require.NoError(t, err, "A's FinishTx on node 1 before B's takeover")

		rec := b.expiredOnNode2(t) // still A's expired claim: A's transaction is not replicated yet
		leaseB := b.takeOver(t, rec)
		commitErr := tx.Commit()
		if commitErr == nil {
			t.Errorf("A's COMMIT on node 1 after B's takeover on node 2 succeeded: A's order and B's claim both stand")
		} else {
			t.Logf("fencing, late commit: A's COMMIT on node 1 failed as it must: %v (transient: %v)", commitErr, idempotency.IsTransient(commitErr))
		}
		b.requireHeldBy(t, leaseB, idempotency.StatusProcessing, "")
		t.Logf("fencing, late commit: galera conflicts: %s", b.c.conflictsSince(t, before))
	})
}
