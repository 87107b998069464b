package idempotency

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// answered tells the server's answer to a statement (nothing of it took
// effect) from a failure that leaves its fate unknown: a dropped
// connection, or a server's report that it ended the session.
func TestAnswered_ServerAnswersVersusLostSessions(t *testing.T) {
	t.Parallel()
	my := func(n uint16) error { return fmt.Errorf("commit: %w", &mysql.MySQLError{Number: n}) }
	pg := func(code string) error { return fmt.Errorf("commit: %w", stateError(code)) }
	for name, tc := range map[string]struct {
		err                     error
		answered, mayHaveLanded bool
	}{
		"deadlock 1213":                      {my(1213), true, false},
		"Group Replication rollback 3101":    {my(3101), true, false},
		"a constraint 1062":                  {my(1062), true, false},
		"read-only 1290":                     {my(1290), true, false},
		"connection killed 1927":             {my(1927), false, true},
		"shutdown 1053":                      {my(1053), false, true},
		"lost from a proxy 2013":             {my(2013), false, true},
		"serialization failure 40001":        {pg("40001"), true, false},
		"a check violation 23514":            {pg("23514"), true, false},
		"bytes not UTF-8 22021":              {pg("22021"), true, false},
		"idle in transaction timeout 25P03":  {pg("25P03"), true, false},
		"terminated 57P01":                   {pg("57P01"), false, true},
		"a proxy's connection failure 08006": {pg("08006"), false, true},
		"lost connection":                    {mysql.ErrInvalidConn, false, true},
		"reset":                              {fmt.Errorf("write: %w", io.ErrUnexpectedEOF), false, true},
		"a bug":                              {errors.New("nil map"), false, false},
	} {
		require.Equal(t, tc.answered, answered(tc.err), "answered: %s", name)
		require.Equal(t, tc.mayHaveLanded, mayHaveLanded(tc.err), "mayHaveLanded: %s", name)
	}
}

type stateError string

func (e stateError) Error() string    { return "SQLSTATE " + string(e) }
func (e stateError) SQLState() string { return string(e) }
