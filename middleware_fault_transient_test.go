package idempotency_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
)

// Faults whose outcome is known only by reading the record, and conflicts
// the database resolves by rolling a transaction back: each is answered
// from the record, by running again where nothing outside the database ran,
// or with 503 and Retry-After. Never 500.

func TestFault_ClaimConnectionLost_TheRecordSaysWhetherTheInsertLanded(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "the INSERT landed before the connection dropped: SELECT finds our PROCESSING, the lease is renewed, the attempt goes on, 201",
			script: func(h *faultHarness) {
				h.claimFails(mysql.ErrInvalidConn)
				h.lookupFinds(faultProcessing(faultOurs, 1))
				h.expectExtend(1).WillReturnResult(faultAffected1)
				h.begin()
				h.orderInserted()
				h.expectFinishDone(2).WillReturnResult(faultAffected1)
				h.commits()
			},
			want: faultCreated,
		},
		{
			// The error reached us after the lease had run out, and another
			// attempt took the key over: the renewal is fenced out.
			name: "our INSERT landed but the lease was taken over before the renewal: claim again, meet the new owner, 409 in-progress",
			script: func(h *faultHarness) {
				h.claimFails(mysql.ErrInvalidConn)
				h.lookupFinds(faultProcessing(faultOurs, 1))
				h.expectExtend(1).WillReturnResult(faultAffected0)
				h.claimTaken()
				h.lookupFinds(faultProcessing(faultTheirs, 2))
			},
			want: faultInProgress,
		},
		{
			name: "the INSERT never landed: SELECT finds nothing, the claim runs again, 201",
			script: func(h *faultHarness) {
				h.claimFails(mysql.ErrInvalidConn)
				h.lookupFindsNothing()
				h.executedUntilCommit()
				h.commits()
			},
			want: faultCreated,
		},
		{
			name: "the connection drops and the record cannot be read: 503 with Retry-After, handler not run",
			script: func(h *faultHarness) {
				h.claimFails(mysql.ErrInvalidConn)
				h.lookupFails(errFaultStoreDown)
			},
			want: faultStoreUnavailable,
		},
	})
}

// expectExtend is the fenced heartbeat UPDATE of our record at version.
func (h *faultHarness) expectExtend(version int64) *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "extend")
	return h.mock.ExpectExec(`UPDATE idempotency_record SET\s+locked_until`).
		WithArgs(faultLeaseMicros, faultScope, faultKey, faultSameOwner{h.owner}, version)
}

// expectInsertFinal is single-phase's record INSERT inside the business
// transaction, carrying the handler's 201.
func (h *faultHarness) expectInsertFinal() *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "claim") // the same INSERT INTO idempotency_record
	return h.mock.ExpectExec(faultSQLClaim).WithArgs(faultScope, faultKey, h.fp, string(idempotency.StatusDone),
		h.owner.insertArg(), http.StatusCreated, faultSnapshotHeaders(faultOrderLocation), []byte(faultOrderBody), faultRetentionMicros)
}

// singlePhaseRun scripts one execution up to the record INSERT.
func (h *faultHarness) singlePhaseRun() {
	h.begin()
	h.orderInserted()
}

func TestFault_SinglePhaseRolledBackByTheDatabase_ReplaysTheWinnerOrRunsAgain(t *testing.T) {
	t.Parallel()
	singlePhase := func(script func(h *faultHarness)) func(h *faultHarness) {
		return func(h *faultHarness) {
			h.mode = idempotency.ModeSinglePhase
			// A fresh single-phase route reads the record before executing
			// (its cache is empty: retries are what arrives after a start).
			h.lookupFindsNothing()
			script(h)
		}
	}
	runFaultCases(t, []faultCase{
		{
			name: "record INSERT deadlocks with a duplicate that committed: ROLLBACK, SELECT, the winner replayed",
			script: singlePhase(func(h *faultHarness) {
				h.singlePhaseRun()
				h.expectInsertFinal().WillReturnError(errFaultDeadlock)
				h.rollsBack()
				h.lookupFinds(faultDoneByThem(2))
			}),
			want: faultReplayOf(faultOtherOrderBody, faultOtherLocation).ran(true),
		},
		{
			name: "certification conflict at COMMIT and no winner: SELECT finds nothing, the handler runs again, 201",
			script: singlePhase(func(h *faultHarness) {
				h.singlePhaseRun()
				h.expectInsertFinal().WillReturnResult(faultAffected1)
				h.expectCommit().WillReturnError(errFaultDeadlock)
				h.lookupFindsNothing()
				h.singlePhaseRun()
				h.expectInsertFinal().WillReturnResult(faultAffected1)
				h.commits()
			}),
			want: faultCreated,
		},
		{
			name: "1020 on the record INSERT and the winner still running: SELECT finds nothing, runs again and meets it, replayed",
			script: singlePhase(func(h *faultHarness) {
				h.singlePhaseRun()
				h.expectInsertFinal().WillReturnError(errFaultRecordChanged)
				h.rollsBack()
				h.lookupFindsNothing()
				h.singlePhaseRun()
				h.expectInsertFinal().WillReturnError(errFaultDuplicate)
				h.rollsBack()
				h.lookupFinds(faultDoneByThem(1))
			}),
			want: faultReplayOf(faultOtherOrderBody, faultOtherLocation).ran(true),
		},
		{
			name: "rolled back on every run: 503 with Retry-After after three runs",
			script: singlePhase(func(h *faultHarness) {
				for range 3 {
					h.singlePhaseRun()
					h.expectInsertFinal().WillReturnResult(faultAffected1)
					h.expectCommit().WillReturnError(errFaultDeadlock)
					h.lookupFindsNothing()
				}
			}),
			want: faultWant{status: http.StatusServiceUnavailable, problem: idempotency.ProblemStoreUnavailable,
				retryAfter: "1", handlerRan: true, outcome: idempotency.OutcomeReleased},
		},
	})
}

// expectInsertFailed is single-phase's autocommit INSERT of a FAILED record
// carrying the handler's 422.
func (h *faultHarness) expectInsertFailed() *sqlmock.ExpectedExec {
	headers, _ := json.Marshal(http.Header{"Content-Type": {"application/json"}})
	h.scripted = append(h.scripted, "claim") // the same INSERT INTO idempotency_record
	return h.mock.ExpectExec(faultSQLClaim).WithArgs(faultScope, faultKey, h.fp, string(idempotency.StatusFailed),
		h.owner.insertArg(), http.StatusUnprocessableEntity, headers, []byte(faultRejectedBody), faultRetentionMicros)
}

// A single-phase rejection is stored by an autocommit INSERT after the
// handler's transaction rolled back. A connection lost before its reply
// leaves the INSERT's fate open (it may have landed, or land later), so
// store-unavailable, which says nothing was recorded, would be false when
// it landed: the fault run of chaos_reset_test.go saw its retries replay
// the 422 (its history check refused it). The record is read instead.
func TestFault_SinglePhaseRejectionInsertLosesItsReply_TheRecordSaysWhatWasStored(t *testing.T) {
	t.Parallel()
	rejected := func(h *faultHarness) {
		h.mode = idempotency.ModeSinglePhase
		h.lookupFindsNothing() // a fresh single-phase route reads the record first
		h.begin()
		h.expectOrderInsert().WillReturnError(errFaultUnknownSKU)
		h.rollsBack()
	}
	ourFailed := faultRow{status: idempotency.StatusFailed, owner: faultOurs, version: 1,
		code: http.StatusUnprocessableEntity, body: faultRejectedBody}
	runFaultCases(t, []faultCase{
		{
			name: "the INSERT landed: SELECT finds our FAILED record, 422",
			script: func(h *faultHarness) {
				rejected(h)
				h.expectInsertFailed().WillReturnError(mysql.ErrInvalidConn)
				h.lookupFinds(ourFailed)
			},
			want: faultRejected,
		},
		{
			name: "SELECT finds nothing, but the INSERT may still land: 503 commit-outcome-unknown",
			script: func(h *faultHarness) {
				rejected(h)
				h.expectInsertFailed().WillReturnError(io.ErrUnexpectedEOF)
				h.lookupFindsNothing()
			},
			want: faultCommitUnknown,
		},
		{
			name: "the record cannot be read: 503 commit-outcome-unknown",
			script: func(h *faultHarness) {
				rejected(h)
				h.expectInsertFailed().WillReturnError(mysql.ErrInvalidConn)
				h.lookupFails(errFaultStoreDown)
			},
			want: faultCommitUnknown,
		},
		{
			name: "a concurrent duplicate's record holds the key: it is replayed",
			script: func(h *faultHarness) {
				rejected(h)
				h.expectInsertFailed().WillReturnError(mysql.ErrInvalidConn)
				h.lookupFinds(faultDoneByThem(1))
			},
			want: faultReplayOf(faultOtherOrderBody, faultOtherLocation).ran(true),
		},
		{
			name: "the server refused the INSERT: nothing was stored, 503 store-unavailable",
			script: func(h *faultHarness) {
				rejected(h)
				h.expectInsertFailed().WillReturnError(errFaultCommitFailed)
			},
			want: faultStoreUnavailable.ran(true),
		},
	})
}
