// Command idemctl is the operator CLI of the idempotency store: it answers
// "what happened to key X at 3 a.m." without SQL, and unsticks, purges and
// migrates records.
//
//	Usage:
//
//		idemctl [--db URL] <command> [flags]
//
//	The database URL comes from --db or, when that is absent, from the
//	IDEMCTL_DB environment variable. --db may also follow the command.
//
//		mysql://DSN    a go-sql-driver/mysql DSN, e.g.
//		               mysql://app:secret@tcp(db.internal:3306)/orders
//		               (interpolateParams and parseTime are turned on)
//		postgres://…   a pgx connection string URL (also postgresql://), e.g.
//		               postgres://app:secret@db.internal:5432/orders?sslmode=disable
//		               (add search_path=SCHEMA for a schema other than public)
//		sqlite://PATH  an SQLite database file, e.g. sqlite:///var/lib/orders.db
//
//	Commands:
//
//		migrate
//		    Apply the schema migrations. Safe to repeat.
//
//		stats [--json]
//		    Records by status, age of the oldest PROCESSING record, expired
//		    leases, final records awaiting purge, and table size.
//
//		inspect --scope S --key K [--body] [--json]
//		    One record: state, owner (locked_by), lease version, lease expiry,
//		    created/updated/expires times, fingerprint, and the stored response
//		    (status code, headers, body size; --body prints the body).
//
//		release --scope S --key K [--yes]
//		    Delete a stuck PROCESSING record so that its key executes again on
//		    the next retry. Shows the record and asks for "yes" on stdin unless
//		    --yes is given; the delete is fenced by the owner and lease version
//		    shown, so a record that changed meanwhile is left alone. Release only
//		    a key whose attempt is known dead AND whose effect is known absent;
//		    otherwise let the reconciler decide.
//
//		purge [--older-than D]
//		    Delete final (DONE/FAILED) records past their retention, or, with
//		    --older-than D (a Go duration such as 72h), final records created
//		    more than D ago whatever their retention. Prints the count.
//		    PROCESSING records are never purged.
//
//		anomalies [--limit N] [--json]
//		    Payment anomalies, newest first (at most N, default 100): verified
//		    provider events the order store recorded but could not apply
//		    (unknown-order, amount-mismatch, currency-mismatch, order-mismatch,
//		    double-payment, refund-exceeds-payment, payload-mismatch), and the
//		    refunds owed by canceled orders that were paid (refund-owed, listed
//		    until the refunds cover the payment). Each line: when, reason,
//		    provider, event id, kind, payment id, order, amount in minor units
//		    (for refund-owed, the amount still owed) and currency.
//
//		help
//		    Print this text.
//
//	--scope defaults to "", the scope of a middleware without a ScopeFunc.
//	Times are the database's clock.
//
//	Exit codes:
//
//		0  success
//		1  usage error: no or unknown command, bad flag or argument, no --db
//		2  cannot connect: bad database URL or DSN, unreachable server,
//		   missing SQLite file
//		3  not found: no record for the scope and key
//		4  refused: record not PROCESSING, record changed meanwhile (fenced
//		   out), or release not confirmed
//		5  any other failure
package main
