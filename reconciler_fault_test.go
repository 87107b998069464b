package idempotency_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

var errReconcileFault = errors.New("connection refused")

var expiredLeaseColumns = []string{"scope", "idempotency_key", "request_fingerprint", "status", "locked_by",
	"lease_version", "response_status", "response_headers", "response_body", "created_at", "updated_at",
	"locked_until", "expires_at", "lease_expired", "expired", "read_at"}

func expiredLeaseRow(key string) []driver.Value {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return []driver.Value{"s", key, "fp", "PROCESSING", "dead/1", int64(1), nil, nil, nil, now, now, now, now.Add(time.Hour), true, false, now}
}

func TestReconcilerFaults_EveryStatementFailing_IsReportedAndChangesNothingElse(t *testing.T) {
	t.Parallel()
	found := func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
		return &idempotency.Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte("{}")}, true, nil
	}
	missing := func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
		return nil, false, nil
	}
	cases := []struct {
		name    string
		recover idempotency.RecoverFunc
		script  func(m sqlmock.Sqlmock)
		want    string
	}{
		{"scan fails", missing, func(m sqlmock.Sqlmock) {
			m.ExpectQuery(`SELECT scope, idempotency_key`).WillReturnError(errReconcileFault)
		}, "expired leases"},
		{"backfill fails: set aside", found, func(m sqlmock.Sqlmock) {
			m.ExpectQuery(`SELECT scope, idempotency_key`).WillReturnRows(sqlmock.NewRows(expiredLeaseColumns).AddRow(expiredLeaseRow("k")...))
			m.ExpectExec(`UPDATE idempotency_record SET\s+status`).WillReturnError(errReconcileFault)
			m.ExpectExec(`UPDATE idempotency_record SET\s+locked_until`).WithArgs(sqlmock.AnyArg(), "s", "k", "dead/1", int64(1)).
				WillReturnResult(sqlmock.NewResult(0, 1))
		}, "finish"},
		{"release fails: set aside", missing, func(m sqlmock.Sqlmock) {
			m.ExpectQuery(`SELECT scope, idempotency_key`).WillReturnRows(sqlmock.NewRows(expiredLeaseColumns).AddRow(expiredLeaseRow("k")...))
			m.ExpectExec(`DELETE FROM idempotency_record`).WillReturnError(errReconcileFault)
			m.ExpectExec(`UPDATE idempotency_record SET\s+locked_until`).WillReturnResult(sqlmock.NewResult(0, 1))
		}, "release"},
		{"recover hook fails: set aside", func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
			return nil, false, errReconcileFault
		}, func(m sqlmock.Sqlmock) {
			m.ExpectQuery(`SELECT scope, idempotency_key`).WillReturnRows(sqlmock.NewRows(expiredLeaseColumns).AddRow(expiredLeaseRow("k")...))
			m.ExpectExec(`UPDATE idempotency_record SET\s+locked_until`).WillReturnResult(sqlmock.NewResult(0, 1))
		}, "recover"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherRegexp))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			c.script(mock)
			r := &idempotency.Reconciler{Store: idempotency.NewMySQLStore(db), Recover: c.recover}
			recovered, reclaimed, err := r.RunOnce(context.Background())
			require.ErrorContains(t, err, c.want)
			require.Zero(t, recovered+reclaimed)
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

func TestPurgeFaults_DeleteFailing_StopsAndReportsWhatWasDeleted(t *testing.T) {
	t.Parallel()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherRegexp))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	mock.ExpectExec(`DELETE FROM idempotency_record\s+WHERE status IN \('DONE', 'FAILED'\) AND expires_at`).WithArgs(2).WillReturnResult(sqlmock.NewResult(0, 2))
	mock.ExpectExec(`DELETE FROM idempotency_record\s+WHERE status IN \('DONE', 'FAILED'\) AND expires_at`).WithArgs(2).WillReturnError(errReconcileFault)

	n, err := idempotency.Purge(context.Background(), idempotency.NewMySQLStore(db), 2, nil)
	require.ErrorIs(t, err, errReconcileFault)
	require.EqualValues(t, 2, n, "the first batch's deletions are reported")
	require.NoError(t, mock.ExpectationsWereMet())
}
