package idempotency

import (
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
)

// conflicted is err as ErrPaymentConflict when the database refused the
// transaction for a concurrent change, having rolled it back: MariaDB's
// innodb_snapshot_isolation (1020: a row changed since the transaction's
// snapshot, the default from MariaDB 11.6.2), a deadlock (MySQL 1213,
// PostgreSQL 40P01) or a serialization failure (40001). Its retry meets the
// state the other transaction left, as any ErrPaymentConflict's does.
func conflicted(err error) error {
	if err == nil || errors.Is(err, ErrPaymentConflict) {
		return err
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1020 || me.Number == 1213) {
		return fmt.Errorf("%w: %w", ErrPaymentConflict, err)
	}
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) && (pe.SQLState() == "40001" || pe.SQLState() == "40P01") {
		return fmt.Errorf("%w: %w", ErrPaymentConflict, err)
	}
	return err
}
