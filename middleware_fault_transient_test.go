package idempotency_test

import (
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
		h.owner, http.StatusCreated, faultSnapshotHeaders(faultOrderLocation), []byte(faultOrderBody), faultRetentionMicros)
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
