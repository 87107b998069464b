package idempotency

import (
	"database/sql"
	"testing"
)

// CountedMySQL opens a fresh migrated MariaDB/MySQL database through
// OpenMySQL's pool whose connections count the statements they send
// (roundtrips_internal_test.go), for paymenttest's Engine.Counted in
// order_payment_test.go: the statement counts of the payment paths are
// specified there, in the conformance suite, for every engine.
func CountedMySQL(t *testing.T) (*sql.DB, func() int) {
	t.Helper()
	db, n := countedMySQL(t, openMySQL)
	db.SetMaxOpenConns(80)
	db.SetMaxIdleConns(80)
	return db, n.load
}
