// Package sqlite is the embedded idempotency store: the SQLite Dialect for
// idempotency.SQLStore, a correctly configured database handle, and Migrate
// for the SQLite schema. It lives in its own package so that importing the
// root package (which serves MySQL) never compiles SQLite.
//
// Typical use:
//
//	db, err := sqlite.Open("idempotency.db")
//	if err != nil { ... }
//	if err := sqlite.Migrate(ctx, db); err != nil { ... }
//	store := sqlite.NewStore(db)
//
// # Concurrency
//
// SQLite has a single writer. Open puts the file in WAL mode, so readers
// (Lookup of a duplicate request, replays) never wait for it, and makes every
// transaction begin with BEGIN IMMEDIATE, so the business transaction takes
// the write lock when it starts instead of failing to upgrade a read snapshot
// later. Writers queue on busy_timeout; a statement that still finds the
// database busy gets SQLITE_BUSY, which the Dialect reports as transient.
//
// Because the business transaction holds the write lock for as long as the
// handler runs, every other write (another request's Claim, a TakeOver, the
// reconciler) waits for it; keep handlers short with this store. The same
// lock makes a lease heartbeat unnecessary while the transaction is open, as
// no other attempt can take the key over until it ends, and harmful: a
// handler that calls idempotency.ExtendLease runs Extend on a second
// connection, which waits for the handler's own transaction and fails with
// SQLITE_BUSY once busy_timeout (or the handler's context) runs out.
//
// # Clock
//
// All times are INTEGER Unix microseconds computed by SQLite's clock in the
// statements themselves, like NOW(6) on MySQL. SQLite's clock resolves
// milliseconds, so stored times are whole milliseconds plus the lease or
// retention in microseconds.
package sqlite
