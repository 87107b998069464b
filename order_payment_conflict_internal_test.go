package idempotency

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

type sqlStateError string

func (e sqlStateError) Error() string    { return "pg: " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// A transaction the database rolled back for a concurrent change is a
// conflict to retry; any other error is not.
func TestConflicted_ConcurrentChangesAreConflicts(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&mysql.MySQLError{Number: 1020}, &mysql.MySQLError{Number: 1213},
		fmt.Errorf("lock order: %w", &mysql.MySQLError{Number: 1020}),
		sqlStateError("40001"), sqlStateError("40P01"),
	} {
		got := conflicted(err)
		require.ErrorIs(t, got, ErrPaymentConflict, "%v", err)
		require.ErrorIs(t, got, err, "the database's error stays inside")
		require.True(t, IsTransient(got))
	}
	for _, err := range []error{nil, errors.New("x"), &mysql.MySQLError{Number: 1062}, sqlStateError("23505")} {
		require.Equal(t, err, conflicted(err))
	}
}
