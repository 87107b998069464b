// Package postgres is the idempotency store for PostgreSQL 13+ (tested on
// 15), through pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib),
// so that idempotency.TxFromContext hands handlers a *sql.Tx as with every
// other store. It is a module of its own: services on MySQL never get pgx
// in their module graph.
//
//	db, err := postgres.Open("postgres://app@db:5432/shop?sslmode=disable")
//	if err != nil { ... }
//	if err := postgres.Migrate(ctx, db); err != nil { ... }
//	mw, err := idempotency.New(postgres.NewStore(db), &idempotency.Config{Route: "create_order"})
//
// Handlers write with $1, $2 placeholders on the transaction from
// idempotency.TxFromContext, and classify their own errors with
// idempotency.IsTransient, which classifies PostgreSQL's SQLSTATEs by class
// and code (a serialization failure, a deadlock, a read-only standby, a
// statement timeout, a terminated session, too many connections...)
// without importing pgx.
//
// # What the store relies on
//
// Times come from the database's clock, read once per statement with
// clock_timestamp(); now() is the transaction's start. Inserts of a record
// use ON CONFLICT DO NOTHING and a row count, so a taken key is never an
// error: inside the business transaction an error would abort it, and every
// unique violation would be a server ERROR in the log. Fenced statements
// read PostgreSQL's exact row counts.
//
// The one exception is single-phase's record on a pool from Open or OpenDB:
// there the INSERT is the business transaction's last statement and travels
// with the COMMIT in one pipeline, without ON CONFLICT, so that a taken key
// aborts the transaction and the COMMIT commits nothing (see OpenDB). A
// *sql.DB opened with pgx's own stdlib.OpenDB works too, one round trip
// more per new key.
//
// # Connections
//
// PostgreSQL starts a server process per connection: Open's pool holds up
// to MaxConns (25), so that three instances fit a default server. Its
// connections wait up to SlotWait for a slot when the server is full
// (53300), make an attempt the network cut again, and are never handed out
// dead: a pooled connection the network or the server ended is found by a
// peek at its socket when database/sql takes it. When connections die, the
// pool's limit halves (down to 2) and grows back while they live, so that
// a flapping network does not cost the server a pool of processes at each
// cut. For more instances, put
// PgBouncer in front in transaction pooling mode and add
// default_query_exec_mode=cache_describe to the URL (see the README).
//
// # Isolation
//
// Run the pool at the server default, READ COMMITTED: the store's statements
// inside the business transaction (claim-first's finish, single-phase's
// insert) then read the latest committed record, which fencing needs, and
// wait for a concurrent duplicate's commit rather than miss it.
//
// A handler that needs REPEATABLE READ or SERIALIZABLE sets it as its
// transaction's first statement:
//
//	tx, _ := idempotency.TxFromContext(r.Context())
//	if _, err := tx.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil { ... }
//
// A serialization failure (40001) is then a known rollback: met in the
// handler, IsTransient lets it answer 503 with Retry-After; met in the
// record's statement or at COMMIT, the middleware answers 503 with
// Retry-After and releases the key (claim-first) or runs the handler again
// (single-phase, up to three runs). It is never a 500 and never a second
// effect. One thing does not work at these levels: claim-first's
// idempotency.ExtendLease after the transaction's first statement changes
// the record after the transaction's snapshot, so the finish matches no row
// and the attempt rolls back (answered 409 in-progress; the key is free once
// the lease expires). Handlers that heartbeat run at READ COMMITTED.
//
// # Schema
//
// Migrate applies the embedded migrations/*.sql to the current schema (the
// first of search_path) under a session advisory lock, so several processes
// may call it at once. The versions and names are those of the MySQL and
// SQLite schemas. idempotency_record has PRIMARY KEY (scope,
// idempotency_key) on text COLLATE "C" (byte-wise, case-sensitive), jsonb
// headers, a bytea body, timestamptz times and the (status, expires_at)
// index. Text holds UTF-8 without NUL: the store says so
// (idempotency.TextChecker), so the middleware answers a scope that is not
// (a Latin-1 header, say) 401 before anything executes, and the store
// refuses such a claim before any statement. The middleware's keys are
// visible ASCII, which text always holds. purchase_order is the reference order table,
// which the root package's order state machine writes through
// idempotency.PostgresOrders (its Create, Transition and Get take $n
// placeholders and skip a duplicate with ON CONFLICT DO NOTHING, so a
// duplicate order is ErrDuplicateOrder without aborting the transaction).
//
// # Tests
//
// Package pgtest gives each test a fresh schema of its own and the pgx URL
// naming it (search_path), for this module's tests, the example server's
// and idemctl's, and a service's own.
package postgres
