#!/usr/bin/env bash
# Counts the instructions a PostgreSQL backend spends per create, with and
# without single-phase's idempotency record, under valgrind's callgrind:
# instruction counts repeat run after run, whatever else the machine does,
# where throughput on a shared two-core machine moves by 10 % between runs.
#
#   scripts/pg-record-cost.sh
#
# It starts a throw-away PostgreSQL cluster under callgrind on a loopback
# port, applies postgres/migrations, and drives one client with pgbench
# through the example service's create (BEGIN, the SKU's price, the order
# INSERT, its INIT→CREATED UPDATE, COMMIT) and the same create with the
# record's INSERT pipelined with the COMMIT, as postgres.OpenDB sends it;
# the record once with migration 001's CHECK constraints (004's down script)
# and once without (004). Each variant runs N1 and N2 transactions on a
# fresh connection; (instructions(N2) - instructions(N1)) / (N2 - N1) is the
# cost of one, without the connection's start-up. It prints one line per
# variant.
#
# Needs valgrind, pgbench, initdb and postgres (PG_BINDIR, default
# `pg_config --bindir`). Run as root, it runs the server as PG_USER
# (default postgres), since initdb refuses root.
#
# Environment: PG_BINDIR, PG_USER, PORT (default 5499), N1 (200), N2 (1200).
set -euo pipefail

cd "$(dirname "$0")/.."
bindir=${PG_BINDIR:-$(pg_config --bindir)}
port=${PORT:-5499}
n1=${N1:-200}
n2=${N2:-1200}
dir=$(mktemp -d "${TMPDIR:-/tmp}/pg-record-cost.XXXXXX")
as=()
if [ "$(id -u)" = 0 ]; then
	as=(runuser -u "${PG_USER:-postgres}" --)
	chown "${PG_USER:-postgres}" "$dir"
fi
cleanup() {
	"${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

"${as[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log"
# autovacuum off: an ANALYZE would invalidate the cached plans mid-run.
"${as[@]}" valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" \
	"$bindir/postgres" -D "$dir/data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 \
	-c autovacuum=off -c max_wal_size=4GB >"$dir/server.log" 2>&1 &
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres PGSSLMODE=disable
for _ in $(seq 120); do
	psql -qAtc 'SELECT 1' >/dev/null 2>&1 && break
	sleep 1
done

psql -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE sku (id bigint PRIMARY KEY, name text NOT NULL, price_cents bigint NOT NULL);
INSERT INTO sku SELECT i, 'sku ' || i, 1999 FROM generate_series(20001, 20100) AS i;
SQL
for f in postgres/migrations/00[1-4]_*.up.sql; do
	psql -q -v ON_ERROR_STOP=1 -f "$f"
done

# The record's statement is the store's, as postgres.OpenDB sends it with
# the COMMIT; its headers and body are parameters, as pgx binds them.
record=$(sed -n '/^const insertFinalWithCommit = `/,/`$/p' postgres/postgres.go |
	sed -e '1s/^const insertFinalWithCommit = `//' -e '$s/`$//' | tr '\n' ' ' |
	sed -e 's/\$1/:scope/; s/\$2/:key/; s/\$3/:fp/; s/\$4/:status/; s/\$5/:owner/' \
		-e 's/\$6::smallint/:code::smallint/; s/\$7::jsonb/:headers::jsonb/; s/\$8::bytea/:body::bytea/; s/\$9::bigint/:retention::bigint/')
create() { # the create, with $1 before its COMMIT
	cat <<EOF
\set sku random(20001, 20100)
\set ono random(1, 1000000000000000)
SELECT 'user:7' AS scope, 'key-' || :ono AS key, repeat('a', 64) AS fp, 'DONE' AS status, 'host-1234' AS owner,
  201 AS code, '{"Content-Type":["application/json"],"Location":["/orders/' || :ono || '"]}' AS headers,
  convert_to('{"order_no":"' || :ono || '","user_id":7,"sku_id":' || :sku || ',"quantity":2,"status":"CREATED"}', 'UTF8') AS body,
  86400000000 AS retention \gset
BEGIN;
SELECT price_cents FROM sku WHERE id = :sku;
INSERT INTO purchase_order (order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id, unit_price_cents, discount_cents, total_cents, status) VALUES (:ono, :scope, :key, 7, :sku, 2, NULL, 1999, 0, 3998, 'INIT') ON CONFLICT DO NOTHING;
UPDATE purchase_order SET status = 'CREATED', updated_at = clock_timestamp() WHERE order_no = :ono AND status = 'INIT';
$1
EOF
}
create 'COMMIT;' >"$dir/bare.sql"
create "\\startpipeline
$record;
COMMIT;
\\endpipeline" >"$dir/record.sql"

# run SCRIPT N: the instructions of the backend that ran N transactions.
run() {
	local before after
	before=$(ls "$dir"/cg.* 2>/dev/null | sort || true)
	pgbench -n -M prepared -c 1 -t "$2" -f "$1" >"$dir/pgbench.log" 2>&1 || { cat "$dir/pgbench.log" >&2; exit 1; }
	sleep 2 # the backend writes its profile as it exits
	after=$(ls "$dir"/cg.* | sort)
	comm -13 <(echo "$before") <(echo "$after") | while read -r f; do
		sed -n 's/^summary: //p' "$f"
	done | sort -n | tail -1
}
per() { # LABEL SCRIPT
	local a b
	a=$(run "$2" "$n1")
	b=$(run "$2" "$n2")
	printf '%-44s %8d instructions per create\n' "$1" $(((b - a) / (n2 - n1)))
}

down=$(sed -n '/^ALTER TABLE/p' postgres/migrations/004_drop_record_checks.down.sql)
up=$(sed -n '/^ALTER TABLE/p' postgres/migrations/004_drop_record_checks.up.sql)
per "bare create" "$dir/bare.sql"
psql -q -v ON_ERROR_STOP=1 -c "$down"
per "single-phase record, 001's CHECKs" "$dir/record.sql"
psql -q -v ON_ERROR_STOP=1 -c "$up"
per "single-phase record, no CHECKs (004)" "$dir/record.sql"
