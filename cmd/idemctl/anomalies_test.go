package main

import (
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/sqlite"
)

// makeAnomalies makes two anomalies through the order store, as payment
// callbacks would: a paid order canceled afterwards (refund-owed, 1500
// CNY), then a success for an order that does not exist (unknown-order).
// The second is the newer; its event id also sorts first, so that it
// lists first even where the clock ticks in whole seconds (SQLite).
func makeAnomalies(t *testing.T, db *sql.DB, orders idempotency.Orders) {
	t.Helper()
	inTx := func(f func(tx *sql.Tx) error) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
	}
	inTx(func(tx *sql.Tx) error {
		return orders.Create(ctx, tx, &idempotency.Order{
			OrderNo: "O-paid", Scope: "7", IdempotencyKey: "k-paid", UserID: 7, SKUID: 20001, Quantity: 1,
			UnitPriceCents: 1500, TotalCents: 1500, Currency: "CNY",
		})
	})
	inTx(func(tx *sql.Tx) error {
		out, err := orders.ApplyPayment(ctx, tx, idempotency.PaymentEvent{Provider: "stripe", EventID: "evt-b-paid",
			PaymentID: "pi-paid", OrderNo: "O-paid", Kind: idempotency.PaymentSucceeded, Amount: 1500, Currency: "CNY"})
		require.True(t, out.Applied)
		return err
	})
	inTx(func(tx *sql.Tx) error {
		st, err := orders.RequestCancel(ctx, tx, "O-paid")
		require.Equal(t, idempotency.OrderCanceled, st)
		return err
	})
	inTx(func(tx *sql.Tx) error {
		out, err := orders.ApplyPayment(ctx, tx, idempotency.PaymentEvent{Provider: "stripe", EventID: "evt-a-unknown",
			PaymentID: "pi-unknown", OrderNo: "O-nowhere", Kind: idempotency.PaymentSucceeded, Amount: 990, Currency: "CNY"})
		require.Equal(t, idempotency.AnomalyUnknownOrder, out.Anomaly)
		return err
	})
}

// requireAnomalyListing checks anomalies on a database makeAnomalies
// filled: JSON, --limit and the table.
func requireAnomalyListing(t *testing.T, dbURL string) {
	t.Helper()
	r := idemctl(t, "", "--db", dbURL, "anomalies", "--json")
	require.Equal(t, exitOK, r.code)
	var got []anomalyJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Len(t, got, 2)
	for i := range got {
		require.False(t, got[i].At.IsZero(), "every anomaly has a time")
		require.WithinDuration(t, time.Now(), got[i].At, 24*time.Hour, "MySQL's times are its wall clock, read as UTC")
		got[i].At = time.Time{}
		require.NotEmpty(t, got[i].Digest, "an empty digest is a SHA-256 of the fields")
		got[i].Digest = ""
	}
	require.Equal(t, []anomalyJSON{
		{Reason: "unknown-order", Provider: "stripe", EventID: "evt-a-unknown", Kind: "SUCCEEDED",
			PaymentID: "pi-unknown", OrderNo: "O-nowhere", AmountCents: 990, Currency: "CNY"},
		{Reason: "refund-owed", Provider: "stripe", EventID: "evt-b-paid", Kind: "SUCCEEDED",
			PaymentID: "pi-paid", OrderNo: "O-paid", AmountCents: 1500, Currency: "CNY"},
	}, got, "newest first")

	r = idemctl(t, "", "--db", dbURL, "anomalies", "--limit", "1", "--json")
	require.Equal(t, exitOK, r.code)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Len(t, got, 1)
	require.Equal(t, "unknown-order", got[0].Reason, "--limit keeps the newest")

	r = idemctl(t, "", "--db", dbURL, "anomalies")
	require.Equal(t, exitOK, r.code)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 4, "header, two anomalies, count")
	require.Regexp(t, `^WHEN\s+REASON\s+PROVIDER\s+EVENT\s+KIND\s+PAYMENT\s+ORDER\s+AMOUNT\s+CURRENCY$`, lines[0])
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\S+Z\s+unknown-order\s+stripe\s+evt-a-unknown\s+SUCCEEDED\s+pi-unknown\s+O-nowhere\s+990\s+CNY$`, lines[1])
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\S+Z\s+refund-owed\s+stripe\s+evt-b-paid\s+SUCCEEDED\s+pi-paid\s+O-paid\s+1500\s+CNY$`, lines[2])
	require.Equal(t, "2 anomalies (amounts in minor units; refund-owed is the amount still owed)", lines[3])
	require.Empty(t, r.stderr)
}

func TestAnomalies_MySQL_ListsUnknownOrderAndRefundOwed_NewestFirst(t *testing.T) {
	t.Parallel()
	_, db, dbURL := mysqlStore(t)
	makeAnomalies(t, db, idempotency.MySQLOrders)
	requireAnomalyListing(t, dbURL)
}

func TestAnomalies_Postgres_ListsUnknownOrderAndRefundOwed_NewestFirst(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.Postgres(t)
	require.NoError(t, postgres.Migrate(ctx, db))
	makeAnomalies(t, db, idempotency.PostgresOrders)
	requireAnomalyListing(t, dbURL)
}

func TestAnomalies_SQLite_ListsUnknownOrderAndRefundOwed_NewestFirst(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "orders.db")
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, sqlite.Migrate(ctx, db))
	makeAnomalies(t, db, idempotency.SQLiteOrders)
	requireAnomalyListing(t, "sqlite://"+path)
}

func TestAnomalies_RefundCoveringTheOwedAmount_TakesItOffTheList(t *testing.T) {
	t.Parallel()
	_, db, dbURL := mysqlStore(t)
	makeAnomalies(t, db, idempotency.MySQLOrders)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = idempotency.MySQLOrders.ApplyPayment(ctx, tx, idempotency.PaymentEvent{Provider: "stripe", EventID: "evt-c-refund",
		PaymentID: "pi-paid", Kind: idempotency.PaymentRefunded, Amount: 1500, Currency: "CNY"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	r := idemctl(t, "", "--db", dbURL, "anomalies", "--json")
	require.Equal(t, exitOK, r.code)
	var got []anomalyJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Len(t, got, 1)
	require.Equal(t, "unknown-order", got[0].Reason)
}

func TestAnomalies_None_SaysSoAndJSONIsAnEmptyList(t *testing.T) {
	t.Parallel()
	_, _, dbURL := mysqlStore(t)

	r := idemctl(t, "", "--db", dbURL, "anomalies")
	require.Equal(t, exitOK, r.code)
	require.Regexp(t, `^no payment anomalies in MySQL/MariaDB at \S+, database \S+\n$`, r.stdout)

	r = idemctl(t, "", "--db", dbURL, "anomalies", "--json")
	require.Equal(t, exitOK, r.code)
	require.Equal(t, "[]\n", r.stdout)
}

func TestAnomalies_NonPositiveLimit_IsAUsageError(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"0", "-3"} {
		r := idemctl(t, "", "--db", "sqlite:///nonexistent/never-opened.db", "anomalies", "--limit", n)
		require.Equal(t, exitUsage, r.code, n)
		require.Contains(t, r.stderr, "--limit must be a positive number")
		require.Contains(t, r.stderr, "usage: idemctl [--db URL] anomalies [--limit N] [--json]")
	}
}

func TestAnomalies_Help_DocumentsTheCommand(t *testing.T) {
	t.Parallel()
	r := idemctl(t, "", "anomalies", "-h")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "usage: idemctl [--db URL] anomalies [--limit N] [--json]")
	require.Contains(t, r.stdout, "-limit int")
	for _, reason := range []idempotency.AnomalyReason{
		idempotency.AnomalyUnknownOrder, idempotency.AnomalyAmountMismatch, idempotency.AnomalyCurrencyMismatch,
		idempotency.AnomalyOrderMismatch, idempotency.AnomalyDoublePayment, idempotency.AnomalyRefundExceedsPayment,
		idempotency.AnomalyPayloadMismatch, idempotency.AnomalyRefundOwed,
	} {
		require.Contains(t, usage, string(reason), "idemctl help names every reason")
	}
}

func TestAnomalies_SchemaBeforePayments_FailsWithAHintToMigrate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "empty.db")
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	require.NoError(t, db.Ping())
	require.NoError(t, db.Close())

	r := idemctl(t, "", "--db", "sqlite://"+path, "anomalies")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "run idemctl migrate")
}
