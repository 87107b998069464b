package main

import (
	"context"
	"net/http"
	"os"
	"testing"

	"github.com/orderguard/idempotency"
)

// The postgres family serves the example service on a fresh database, B3
// counts one execution there, and the database is gone after close. It
// needs a server: skipped without one, except in CI.
func TestPostgresFamily_OneKeyExecutesOnceAndTheDatabaseIsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if err := pingPostgres(ctx, url); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	f, err := openPostgres(ctx, url, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	var name string
	if err := f.db.QueryRowContext(ctx, "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []idempotency.Mode{idempotency.ModeClaimFirst, idempotency.ModeSinglePhase} {
		tg, err := f.firstTarget(idempotency.Config{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		_, statuses, orders, key, err := fireOneKey(newClient(8), tg, 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		n, err := f.countOrders(ctx, "1", key)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || orders != 1 || statuses[http.StatusCreated] == 0 {
			t.Fatalf("%s: %d executions, %d order numbers, statuses %v; want exactly one", modeName(mode), n, orders, statuses)
		}
	}
	if probe := f.probe(); probe["round_trips"] == 0 {
		t.Fatalf("probe %v: no round trips counted", probe)
	}

	f.close()
	admin, _, err := postgresAdmin(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var left int
	if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM pg_database WHERE datname = $1", name).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("database %s still exists after close", name)
	}
}
