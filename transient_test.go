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
		"duplicate key 1062":                     {server(1062), false},
		"unknown column 1054":                    {server(1054), false},
		"foreign key 1452":                       {server(1452), false},
		"no rows":                                {sql.ErrNoRows, false},
		"a bug":                                  {errors.New("nil map"), false},
		"nil":                                    {nil, false},
	} {
		require.Equal(t, tc.want, idempotency.IsTransient(tc.err), name)
	}
}
