package migrations

import (
	"context"
	"database/sql"
)

// ApplyTo is Apply stopping after version target, so that tests can build
// the state a crash in migration target+1 leaves.
func ApplyTo(ctx context.Context, db *sql.DB, dialect string, target int) error {
	return apply(ctx, db, dialect, target)
}

// RunStep runs s on conn as Apply does, and reports whether its statement
// ran.
func RunStep(ctx context.Context, conn *sql.Conn, s Step) (bool, error) {
	return s.run(ctx, conn)
}
