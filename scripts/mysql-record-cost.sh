#!/usr/bin/env bash
# Counts the instructions a MariaDB server spends per create, with and
# without the idempotency record, under valgrind's callgrind: instruction
# counts repeat within about 1-2 % run after run, whatever else the machine
# does, where throughput on a shared two-core machine moves by 10 % between
# runs. The MariaDB counterpart of pg-record-cost.sh.
#
#   scripts/mysql-record-cost.sh
#
# It starts a throw-away mariadbd under callgrind on a loopback port,
# applies the example's catalog schema and migrations/mysql (001-005),
# fills each table with PREFILL rows, and drives one
# client connection over TCP with go-sql-driver/mysql (interpolateParams,
# multiStatements, as idempotency.OpenMySQL's pool) through the example
# service's create as idembench's B0 sends it (START TRANSACTION, the SKU's
# price, the order INSERT, its INIT→CREATED UPDATE, COMMIT), and the same
# create with the record (keys, order numbers and SKUs drawn from a seeded
# generator: random-looking, the same in every run):
#   - single-phase, the record's INSERT sent in one batch with the COMMIT,
#     as OpenMySQL sends it, and sent on its own before the COMMIT, as a
#     plain sql.Open pool sends it;
#   - claim-first: the claim INSERT in autocommit, then the create with the
#     fenced finish UPDATE before the COMMIT;
#   - claim-first and single-phase (batched) without adaptMySQL's
#     SET STATEMENT prefix: what the prefix costs;
#   - single-phase (batched) without the (status, expires_at) index, and
#     with a table holding only the key (its primary key) instead of the
#     record.
# The statements are the store's and the order's (store_mysql.go, order.go),
# with adaptMySQL's SET STATEMENT prefix for those in the transaction; a DONE
# record with a 201 snapshot, a UUIDv4 key and order number new each time.
# Each variant runs N1 and N2 transactions on a fresh connection after a
# warm-up; (instructions(N2) - instructions(N1)) / (N2 - N1) is the cost of
# one, without the connection's start-up. The connection's thread is the
# count that repeats (the counterpart of a PostgreSQL backend); the whole
# server adds its background threads (purge, page cleaner, timers), which
# run on their own clock and are shown for reference. It prints one line
# per variant, and measures the bare create again at the end: its drift
# over the run shows how far apart two counts must be to mean anything.
#
# Needs valgrind, mariadbd and mariadb-install-db (10.11), the mariadb
# client and go. Run as root, it runs the server as MARIADB_USER (default
# mysql).
#
# Environment: MARIADBD, MARIADB_USER, PORT (default 3399), N1 (200),
# N2 (1200), PREFILL (rows in each table before the runs, 20000), KEEP
# (non-empty: keep the temporary directory, with the callgrind dumps, one
# per run in order, for callgrind_annotate).
set -euo pipefail

cd "$(dirname "$0")/.."
mariadbd=${MARIADBD:-$(PATH=$PATH:/usr/sbin command -v mariadbd)}
port=${PORT:-3399}
n1=${N1:-200}
n2=${N2:-1200}
prefill=${PREFILL:-20000}
uuid="INSERT(INSERT(INSERT(INSERT(MD5(seq), 21, 0, '-'), 17, 0, '-'), 13, 0, '-'), 9, 0, '-')"
dir=$(mktemp -d "${TMPDIR:-/tmp}/mysql-record-cost.XXXXXX")
as=()
osuser=$(id -un) client=$(id -un)
if [ "$(id -u)" = 0 ]; then
	osuser=${MARIADB_USER:-mysql} client=root
	as=(runuser -u "$osuser" --)
	chown "$osuser" "$dir"
fi
server=
cleanup() {
	if [ -s "$dir/pid" ]; then
		kill -KILL "$(cat "$dir/pid")" 2>/dev/null || true
	elif [ -n "$server" ]; then
		pkill -KILL -P "$server" 2>/dev/null || true
		kill -KILL "$server" 2>/dev/null || true
	fi
	wait 2>/dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

# The client: the create's statements from the sources, sent as the store
# and the example service send them.
extract() { # FILE NAME: the raw string of the field NAME in FILE, first one
	awk -v name="$2" '!done && $0 ~ "^\t" name ": `" { p = 1; sub("^\t" name ": ", "") }
		p { print; if ($0 ~ /`,$/) { p = 0; done = 1 } }' "$1" | sed '$s/,$//'
}
{
	echo 'package main'
	printf 'const claim = %s\n' "$(extract store_mysql.go Claim)"
	printf 'const finish = %s\n' "$(extract store_mysql.go Finish)"
	printf 'const insertFinal = %s\n' "$(extract store_mysql.go InsertFinal)"
	printf 'const insertOrder = %s\n' "$(extract order.go InsertOrder)"
	printf 'const updateStatus = %s\n' "$(extract order.go UpdateStatus)"
	printf 'const off = %s\n' "$(sed -n 's/^\t\tconst off = //p' store_mysql.go)"
} >"$dir/stmts.go"
cat >"$dir/drive.go" <<'EOF'
package main

import (
	"context"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	mrand "math/rand/v2"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

func main() {
	addr := flag.String("addr", "", "host:port")
	variant := flag.String("variant", "bare", "")
	n := flag.Int("n", 1, "transactions")
	seed := flag.Uint64("seed", 1, "of the keys, order numbers and SKUs")
	flag.Parse()
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName = "tcp", *addr, "bench", "bench", "bench"
	cfg.InterpolateParams, cfg.MultiStatements = true, true
	db := sql.OpenDB(must(mysql.NewConnector(cfg)))
	ctx := context.Background()
	c := must(db.Conn(ctx))
	exec := func(q string, args ...any) int64 {
		r, err := c.ExecContext(ctx, q, args...)
		if err != nil {
			log.Fatalf("%s: %v", q, err)
		}
		k, _ := r.RowsAffected()
		return k
	}
	const retention = int64(24 * time.Hour / time.Microsecond)
	const lease = int64(30 * time.Second / time.Microsecond)
	rnd = mrand.New(mrand.NewPCG(*seed, uint64(*n)))
	for range *n {
		sku := int64(20001 + rnd.IntN(100))
		price := 1000 + (sku-20001)*25
		orderNo := "O" + time.Now().UTC().Format("20060102") + hexn(8)
		key := uuid4()
		scope, orderKey := "7", any(key)
		if *variant == "bare" { // B0: no key, no scope
			scope, orderKey = "", nil
		}
		owner := "host-1234/" + hexn(8)
		fp := hexn(32)
		headers := []byte(`{"Content-Type":["application/json"],"Location":["/orders/` + orderNo + `"]}`)
		body := []byte(fmt.Sprintf(`{"order_no":"%s","user_id":7,"sku_id":%d,"quantity":1,"coupon_id":null,"unit_price_cents":%d,"discount_cents":0,"total_cents":%d,"currency":"CNY","status":"CREATED"}`,
			orderNo, sku, price, price))
		if strings.HasPrefix(*variant, "claim-first") && exec(claim, scope, key, fp, owner, lease, retention) != 1 {
			log.Fatal("claim inserted nothing")
		}
		exec("START TRANSACTION")
		var p int64
		if err := c.QueryRowContext(ctx, "SELECT price_cents FROM sku WHERE id = ?", sku).Scan(&p); err != nil {
			log.Fatal(err)
		}
		exec(insertOrder, orderNo, scope, orderKey, int64(7), sku, 1, nil, p, int64(0), p, "INIT", "CNY")
		if exec(updateStatus, "CREATED", orderNo, "INIT") != 1 {
			log.Fatal("update matched nothing")
		}
		record := []any{scope, key, fp, "DONE", owner, 201, headers, body, retention}
		switch *variant {
		case "bare":
			exec("COMMIT")
		case "batched":
			exec(off+insertFinal+";\nCOMMIT", record...)
		case "separate":
			exec(off+insertFinal, record...)
			exec("COMMIT")
		case "claim-first", "claim-first-no-prefix":
			prefix := off
			if *variant == "claim-first-no-prefix" {
				prefix = ""
			}
			if exec(prefix+finish, "DONE", 201, headers, body, retention, scope, key, owner, int64(1)) != 1 {
				log.Fatal("finish fenced")
			}
			exec("COMMIT")
		case "batched-no-prefix":
			exec(insertFinal+";\nCOMMIT", record...)
		case "key-only":
			exec("INSERT INTO key_only (scope, idempotency_key) VALUES (?, ?);\nCOMMIT", scope, key)
		default:
			log.Fatalf("unknown variant %q", *variant)
		}
	}
	must(0, c.Close())
	must(0, db.Close())
}

// rnd draws the keys: random-looking, and the same in every run, so that
// every run inserts into B-trees of the same shape.
var rnd *mrand.Rand

func bytesn(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rnd.Uint32())
	}
	return b
}

func hexn(n int) string { return hex.EncodeToString(bytesn(n)) }

func uuid4() string {
	b := bytesn(16)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
EOF
go build -o "$dir/drive" "$dir/drive.go" "$dir/stmts.go"

"${as[@]}" mariadb-install-db --no-defaults --datadir="$dir/data" --user="$osuser" >"$dir/install.log" 2>&1 ||
	{ cat "$dir/install.log" >&2; exit 1; }
# Under valgrind: no native AIO, and the buffer pool's address space
# reserved at its size (the default reservation cannot be mapped). Stats
# neither recalculated nor transient: a recalculation would run in the
# connection's thread. No spinning on a busy latch (innodb_spin_wait_delay
# 0), no clock in the buffer pool's LRU (innodb_old_blocks_time 0), one
# purge thread: how long a thread spins, which pages count as young and how
# purge interleaves depend on when the threads run. No binary log, as the
# benchmarks' server.
"${as[@]}" valgrind --tool=callgrind --separate-threads=yes --vgdb-prefix="$dir/vgdb" \
	--callgrind-out-file="$dir/cg.out" \
	"$mariadbd" --no-defaults --datadir="$dir/data" --port="$port" --bind-address=127.0.0.1 \
	--socket="$dir/sock" --pid-file="$dir/pid" --log-error="$dir/error.log" --skip-name-resolve \
	--skip-log-bin --innodb-buffer-pool-size=64M --innodb-buffer-pool-size-max=64M \
	--innodb-use-native-aio=0 --innodb-stats-persistent=ON --innodb-stats-auto-recalc=OFF \
	--innodb-spin-wait-delay=0 --innodb-old-blocks-time=0 --innodb-purge-threads=1 \
	--innodb-buffer-pool-dump-at-shutdown=OFF --innodb-buffer-pool-load-at-startup=OFF \
	>"$dir/server.log" 2>&1 &
server=$!
sql() { mariadb --socket="$dir/sock" -u"$client" "$@"; }
for _ in $(seq 180); do
	sql -e 'SELECT 1' >/dev/null 2>&1 && break
	sleep 1
done
sql -e 'SELECT 1' >/dev/null || { cat "$dir/error.log" >&2; exit 1; }
pid=$(cat "$dir/pid")

sql <<'SQL'
CREATE DATABASE bench;
CREATE USER bench@'%' IDENTIFIED BY 'bench';
GRANT ALL ON bench.* TO bench@'%';
SQL
{
	cat examples/orderservice/schema/mysql.sql
	echo "INSERT INTO sku SELECT seq, CONCAT('sku ', seq), 1000 + (seq - 20001) * 25 FROM seq_20001_to_20100;"
	cat migrations/mysql/00[1-5]_*.up.sql
	echo "CREATE TABLE key_only (scope VARBINARY(255) NOT NULL, idempotency_key VARBINARY(255) NOT NULL, PRIMARY KEY (scope, idempotency_key)) ENGINE=InnoDB;"
	# Tables of some size at the start, so that the runs' own rows (about
	# 9,000) change their B-trees little between the first variant and the
	# last.
	cat <<SQL
INSERT INTO purchase_order (order_no, scope, idempotency_key, user_id, sku_id, quantity, coupon_id,
  unit_price_cents, discount_cents, total_cents, status, currency)
SELECT CONCAT('P', LEFT(SHA2(seq, 256), 24)), '7', $uuid, 7, 20001 + seq % 100, 1, NULL, 1000, 0, 1000, 'CREATED', 'CNY'
FROM seq_1_to_$prefill;
INSERT INTO idempotency_record (scope, idempotency_key, request_fingerprint, status, locked_by, lease_version,
  locked_until, response_status, response_headers, response_body, created_at, updated_at, expires_at)
SELECT '7', $uuid, SHA2(seq, 256), 'DONE', CONCAT('host-1234/', LEFT(MD5(-seq), 16)), 1, NULL, 201,
  CONCAT('{"Content-Type":["application/json"],"Location":["/orders/P', LEFT(SHA2(seq, 256), 24), '"]}'),
  CONCAT('{"order_no":"P', LEFT(SHA2(seq, 256), 24), '","user_id":7,"sku_id":20001,"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000,"currency":"CNY","status":"CREATED"}'),
  NOW(6), NOW(6), NOW(6) + INTERVAL 1 DAY
FROM seq_1_to_$prefill;
INSERT INTO key_only SELECT '7', $uuid FROM seq_1_to_$prefill;
SQL
} | sql bench

seed=0
drive() { # VARIANT N, on a new connection; each run its own keys
	seed=$((seed + 1))
	"$dir/drive" -addr "127.0.0.1:$port" -variant "$1" -n "$2" -seed "$seed"
}
dumps=0 conn=0 all=0
# run VARIANT N: conn, the instructions of the connection's thread that ran
# N transactions, and all, those of the whole server meanwhile.
run() {
	sleep 2 # let purge finish the previous run's transactions
	"${as[@]}" callgrind_control --vgdb-prefix="$dir/vgdb" -z "$pid" >/dev/null 2>&1
	drive "$1" "$2"
	sleep 1 # the server ends the connection
	"${as[@]}" callgrind_control --vgdb-prefix="$dir/vgdb" --dump "$pid" >/dev/null 2>&1
	dumps=$((dumps + 1)) conn=0 all=0
	local f s
	for f in "$dir/cg.out.$dumps"-*; do
		s=$(sed -n 's/^summary: //p' "$f")
		all=$((all + s))
		if grep -q ' dispatch_command' "$f"; then
			conn=$((conn + s))
		fi
	done
}
bare=
per() { # LABEL VARIANT
	local a w
	drive "$2" 50 # warm-up
	run "$2" "$n1"
	a=$conn w=$all
	run "$2" "$n2"
	local one=$(((conn - a) / (n2 - n1))) server=$(((all - w) / (n2 - n1))) over=
	if [ -z "$bare" ]; then
		bare=$one
	else
		over=$(printf '%+d' $((one - bare)))
	fi
	printf '%-46s %8d instructions per create %8s  (whole server %d)\n' "$1" "$one" "$over" "$server"
}

per "bare create (B0)" bare
per "single-phase record, INSERT then COMMIT" separate
per "single-phase record, INSERT;COMMIT batched" batched
per "claim-first: claim, create, finish UPDATE" claim-first
per "claim-first, finish without SET STATEMENT" claim-first-no-prefix
per "single-phase batched, without SET STATEMENT" batched-no-prefix
sql bench -e 'ALTER TABLE idempotency_record DROP INDEX idx_idempotency_record_status_expiry'
per "single-phase batched, no (status, expires_at)" batched
per "key only (primary key), INSERT;COMMIT batched" key-only
per "bare create (B0), again at the end" bare
