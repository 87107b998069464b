package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/sqlite"
)

func Example() {
	dir, err := os.MkdirTemp("", "idempotency-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqlite.Open(filepath.Join(dir, "idempotency.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	if err := sqlite.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	store := sqlite.NewStore(db)

	lease, err := store.Claim(ctx, idempotency.Claim{
		Scope: "orders", Key: "8e0f7a4c-order-1", Fingerprint: "sha256:abc",
		Owner: "instance-1/attempt-1", Lease: 30 * time.Second, Retention: 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	rec, err := store.Lookup(ctx, "orders", "8e0f7a4c-order-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Version, rec.Status, rec.Owner, rec.LeaseExpired)
	// Output: 1 PROCESSING instance-1/attempt-1 false
}
