package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// BenchmarkSinglePhaseRecordInsert measures the ways to write single-phase's
// record inside the business transaction without letting a duplicate's
// error abort it: ON CONFLICT DO NOTHING and a row count (what the Dialect
// does), a savepoint around a plain INSERT, and the plain INSERT for
// reference (a duplicate aborts the transaction, which single-phase rolls
// back anyway). Each op is one business transaction: BEGIN, a ledger INSERT,
// the record, COMMIT (a new key) or ROLLBACK (a duplicate), on one client
// at a time.
//
//	go test -run '^$' -bench SinglePhaseRecordInsert -benchtime 2000x ./postgres/
func BenchmarkSinglePhaseRecordInsert(b *testing.B) {
	// synchronous_commit off takes the WAL flush, the same for every
	// variant and the noisiest part of a commit on a shared disk, out of
	// the numbers, leaving the statements and round trips.
	db, _ := pgtest.Postgres(b, map[string]string{"synchronous_commit": "off"})
	ctx := context.Background()
	if err := postgres.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	onConflict := postgres.Dialect.InsertFinal
	plain, found := strings.CutSuffix(onConflict, "\nON CONFLICT (scope, idempotency_key) DO NOTHING")
	if !found {
		b.Fatal("InsertFinal no longer ends with ON CONFLICT DO NOTHING")
	}
	headers, _ := json.Marshal(map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}})
	args := func(key string) []any {
		return []any{"scope", key, "fingerprint", "DONE", "owner", 201, headers, []byte(`{"order_no":"1"}`), int64(3600e6)}
	}
	// insert writes the record and reports whether the key was taken.
	type insert func(tx *sql.Tx, key string) (taken bool, err error)
	variants := []struct {
		name   string
		insert insert
	}{
		{"on-conflict", func(tx *sql.Tx, key string) (bool, error) {
			res, err := tx.ExecContext(ctx, onConflict, args(key)...)
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 0, err
		}},
		{"savepoint", func(tx *sql.Tx, key string) (bool, error) {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT record"); err != nil {
				return false, err
			}
			if _, err := tx.ExecContext(ctx, plain, args(key)...); err != nil {
				if !postgres.Dialect.IsDuplicate(err) {
					return false, err
				}
				_, err = tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT record")
				return true, err
			}
			_, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT record")
			return false, err
		}},
		{"plain", func(tx *sql.Tx, key string) (bool, error) {
			_, err := tx.ExecContext(ctx, plain, args(key)...)
			if postgres.Dialect.IsDuplicate(err) {
				return true, nil
			}
			return false, err
		}},
	}
	run := func(b *testing.B, in insert, key func(i int) string, wantTaken bool) {
		for i := 0; b.Loop(); i++ {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (note) VALUES ('entry')"); err != nil {
				b.Fatal(err)
			}
			taken, err := in(tx, key(i))
			if err != nil || taken != wantTaken {
				b.Fatalf("taken %v, want %v: %v", taken, wantTaken, err)
			}
			if taken {
				err = tx.Rollback()
			} else {
				err = tx.Commit()
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := db.Exec(plain, args("taken")...); err != nil {
		b.Fatal(err)
	}
	rounds := 0 // -count runs each sub-benchmark again: new keys must stay new
	for _, v := range variants {
		b.Run(v.name+"/new-key", func(b *testing.B) {
			rounds++
			run(b, v.insert, func(i int) string { return fmt.Sprintf("%s-%d-%d", v.name, rounds, i) }, false)
		})
		b.Run(v.name+"/duplicate", func(b *testing.B) {
			run(b, v.insert, func(int) string { return "taken" }, true)
		})
	}
}
