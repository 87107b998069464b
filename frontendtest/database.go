package frontendtest

import (
	"database/sql"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/testdb"
)

// MySQL runs the suite on a fresh MySQL or MariaDB database of
// internal/testdb's server (IDEMPOTENCY_TEST_MYSQL_DSN).
var MySQL Database = mysqlDatabase{}

type mysqlDatabase struct{}

func (mysqlDatabase) Name() string { return "mysql" }

func (mysqlDatabase) Open(t *testing.T) (*sql.DB, idempotency.Store, string) {
	db, _ := testdb.MySQL(t)
	db.SetMaxOpenConns(20) // the suites of several front-ends run at once
	db.SetMaxIdleConns(20)
	return db, idempotency.NewMySQLStore(db), "mysql"
}

func (mysqlDatabase) Unreachable(t *testing.T) idempotency.Store {
	cfg := testdb.BaseConfig(t)
	cfg.Addr = ClosedAddr(t)
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return idempotency.NewMySQLStore(db)
}

func (mysqlDatabase) Deadlock() error {
	return &mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'},
		Message: "Deadlock found when trying to get lock; try restarting transaction"}
}

// ClosedAddr returns a loopback address that refuses connections: a port
// this process listened on and closed.
func ClosedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
