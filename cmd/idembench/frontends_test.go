package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/orderguard/idempotency"
)

// The gRPC family serves the order service over gRPC and measures the bare
// call, a new key per call in each mode and a replay: every call answers
// right (an order, a replay marked and identical to the first answer).
// CI's quick run of the program leaves this family to this spec.
func TestGRPCFamily_EveryCallAnswersRight(t *testing.T) {
	t.Parallel()
	opts, err := parseOptions([]string{"-quick", "-duration", "300ms", "-warmup", "100ms", "-pool", "64"})
	if err != nil {
		t.Fatal(err)
	}
	opts.concurrency = []int{4}
	f := testMariaDB(t, opts, "test_grpc")
	r := runFamily(t, opts, f, (*runner).runGRPC)
	var labels []string
	for _, p := range r.points {
		labels = append(labels, p.label())
		if p.Requests == 0 || p.Errors > 0 {
			t.Errorf("%s: %d requests, %d failed (first: %s)", p.label(), p.Requests, p.Errors, p.FirstError)
		}
	}
	for _, want := range []string{"B1 " + modeName(idempotency.ModeClaimFirst), "B1 " + modeName(idempotency.ModeSinglePhase), "B2 " + modeName(opts.modes[0]) + ", cache on"} {
		if !slices.ContainsFunc(labels, func(l string) bool { return strings.HasSuffix(l, want) }) {
			t.Errorf("no point ending %q among %q", want, labels)
		}
	}
}

// The queue family consumes on both brokers, protected and not, one by one
// and batched, and in a redelivery storm: protected, one order a message
// whatever the deliveries; unprotected, one a delivery. CI's quick run of
// the program leaves this family to this spec.
func TestQueueFamily_OneOrderAMessageProtected(t *testing.T) {
	t.Parallel()
	opts, err := parseOptions([]string{"-quick", "-queue-messages", "60", "-queue-batch", "8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{opts.natsURL, opts.amqpURL} {
		if err := reachable(url); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
	f := testMariaDB(t, opts, "test_queue")
	r := runFamily(t, opts, f, (*runner).runQueue)
	seen := map[string]bool{}
	for _, p := range r.points {
		seen[p.label()] = true
		if p.Requests == 0 || p.Errors > 0 { // run sets Errors when the orders made are not the orders wanted
			t.Errorf("%s: %d messages, %s", p.label(), p.Requests, p.FirstError)
		}
	}
	for _, broker := range []string{"nats", "amqp"} {
		for _, v := range []string{"Q0 " + broker, "Q1 " + broker + " single-phase batched", "Q2 " + broker + " storm claim-first", "Q2 " + broker + " storm unprotected"} {
			if !seen[v] {
				t.Errorf("no point %q among %v", v, seen)
			}
		}
	}
}

// The claim-floor family measures claim-first on the real record and on the
// minimal ones, at the database and over HTTP: every variant answers
// without an error, and the minimal variants write to their own table,
// never to idempotency_record, so what they measure is that table alone.
func TestFloorFamily_MinimalVariantsWriteOnlyTheMinimalRecord(t *testing.T) {
	t.Parallel()
	opts, err := parseOptions([]string{"-quick", "-floor", "-duration", "300ms", "-warmup", "100ms"})
	if err != nil {
		t.Fatal(err)
	}
	opts.slices = 1
	f := testMariaDB(t, opts, "test_floor")
	r := runFamily(t, opts, f, (*runner).runFloor)
	var minimal int64
	seen := map[string]bool{}
	for _, p := range r.points {
		seen[p.label()] = true
		if p.Requests == 0 || p.Errors > 0 {
			t.Errorf("%s: %d requests, %d failed (first: %s)", p.label(), p.Requests, p.Errors, p.FirstError)
		}
		if strings.Contains(p.Variant, "minimal record") {
			minimal += p.Requests
		}
	}
	for _, want := range []string{"B1 claim-first, minimal record", "H1 claim-first",
		"H1 claim-first, minimal record", "H1 claim-first, minimal record with the fingerprint and the answer"} {
		if !seen[want] {
			t.Errorf("no point %q among %v", want, seen)
		}
	}
	ctx := context.Background()
	var rows, replayable int64
	if err := f.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(response_body) FROM `+floorMinimalTable).Scan(&rows, &replayable); err != nil {
		t.Fatal(err)
	}
	// Every minimal request committed its row (warm-ups add more); the
	// replayable variant's rows carry the answer, the others' none.
	if rows < minimal || replayable == 0 || replayable == rows {
		t.Errorf("%d rows in %s (%d with an answer) for %d measured minimal requests", rows, floorMinimalTable, replayable, minimal)
	}
	var real int64
	if err := f.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotency_record WHERE idempotency_key IN (SELECT idempotency_key FROM `+floorMinimalTable+`)`).Scan(&real); err != nil {
		t.Fatal(err)
	}
	if real != 0 {
		t.Errorf("%d keys of the minimal variants in idempotency_record", real)
	}
}
