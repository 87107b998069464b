package idempotency_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func TestIsTransient_InfrastructureAndConflictsYes_BugsAndRefusalsNo(t *testing.T) {
	t.Parallel()
	server := func(n uint16) error { return fmt.Errorf("insert order: %w", &mysql.MySQLError{Number: n}) }
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"deadlock or certification failure 1213": {server(1213), true},
		"lock wait timeout 1205":                 {server(1205), true},
		"MariaDB snapshot conflict 1020":         {server(1020), true},
		"Galera node not primary 1047":           {server(1047), true},
		"Group Replication rollback 3101":        {server(3101), true},
		"TiDB write conflict 9007":               {server(9007), true},
		"TiDB commit rolled back 8022":           {server(8022), true},
		"connection killed 1927":                 {server(1927), true},
		"lost connection":                        {fmt.Errorf("commit: %w", mysql.ErrInvalidConn), true},
		"bad connection":                         {driver.ErrBadConn, true},
		"connection done":                        {sql.ErrConnDone, true},
		"unexpected EOF":                         {io.ErrUnexpectedEOF, true},
		"connection refused":                     {fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		"deadline":                               {context.DeadlineExceeded, true},
		"lease budget ran out":                   {context.Canceled, true},
		"marked by the application":              {fmt.Errorf("pricing: %w", idempotency.ErrTransient), true},
		"MySQL read-only server 1290":            {server(1290), true},
		"read-only mode 1836":                    {server(1836), true},
		"READ ONLY transaction 1792":             {server(1792), true},
		"query interrupted 1317":                 {server(1317), true},
		"MySQL max_execution_time 3024":          {server(3024), true},
		"MariaDB max_statement_time 1969":        {server(1969), true},
		"too many connections 1040":              {server(1040), true},
		"max_user_connections 1203":              {server(1203), true},
		"user resource limit 1226":               {server(1226), true},
		"server shutdown 1053":                   {server(1053), true},
		"idle disconnect 4031":                   {server(4031), true},
		"gone away from a proxy 2006":            {server(2006), true},
		"lost from a proxy 2013":                 {server(2013), true},
		"table definition changed 1412":          {server(1412), true},
		"NOWAIT 3572":                            {server(3572), true},
		"duplicate key 1062":                     {server(1062), false},
		"data too long 1406":                     {server(1406), false},
		"access denied 1045":                     {server(1045), false},
		"unlisted server error 1105":             {server(1105), false},
		"unknown column 1054":                    {server(1054), false},
		"foreign key 1452":                       {server(1452), false},
		"no rows":                                {sql.ErrNoRows, false},
		"a bug":                                  {errors.New("nil map"), false},
		"nil":                                    {nil, false},
	} {
		require.Equal(t, tc.want, idempotency.IsTransient(tc.err), name)
	}
}

// sqlStateError is a server error as pgx's *pgconn.PgError and lib/pq's
// *pq.Error present one: IsTransient matches the method, not a driver.
type sqlStateError string

func (e sqlStateError) Error() string    { return "ERROR: SQLSTATE " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// PostgreSQL's codes by class and by code, constructed: the specs in
// package postgres make the server raise those it raises on demand.
func TestIsTransient_SQLStateByClassAndCode(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		// connection exceptions
		"08000": true, "08003": true, "08006": true, "08P01": true,
		// transaction rollback, but for an integrity constraint at COMMIT
		"40000": true, "40001": true, "40003": true, "40P01": true, "40002": false,
		// insufficient resources, but for a configuration limit
		"53000": true, "53100": true, "53200": true, "53300": true, "53400": false,
		// operator intervention, but for a dropped database
		"57000": true, "57014": true, "57P01": true, "57P02": true, "57P03": true, "57P05": true, "57P04": false,
		// system errors, but for missing or duplicate files
		"58000": true, "58030": true, "58P01": false, "58P02": false,
		"25006": true, "25P03": true, "25P04": true, "55P03": true, "72000": true,
		"25P02": false, "25001": false, // in failed transaction; active transaction
		"23505": false, "23503": false, "23514": false, "22021": false, "22001": false,
		"42601": false, "42P01": false, "28P01": false, "3D000": false, "XX000": false, "0A000": false,
	} {
		err := fmt.Errorf("insert order: %w", sqlStateError(code))
		require.Equal(t, want, idempotency.IsTransient(err), "SQLSTATE %s", code)
	}
}
