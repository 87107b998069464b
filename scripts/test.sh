#!/usr/bin/env bash
# Runs the whole test suite: gofmt, and go test -race with every check of go
# vet, over every package of every module in the workspace.
#
# The suite needs a MySQL-compatible server (MariaDB 10.6+ or MySQL 8) for
# everything that depends on the database. It uses IDEMPOTENCY_TEST_MYSQL_DSN
# (default root@tcp(127.0.0.1:3306)/test). If nothing answers there and a
# local mariadbd is installed, this script starts it, and likewise
# PostgreSQL, Redis, RabbitMQ and NATS (scripts/services.sh). Without a
# server the suites that need it skip with a message, unless CI=true or
# IDEMPOTENCY_REQUIRE_MYSQL=1, in which case they fail.
set -euo pipefail
cd "$(dirname "$0")/.."

dsn="${IDEMPOTENCY_TEST_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}"

t0=$SECONDS
took() { echo "test.sh: $1 in $((SECONDS - t0))s"; t0=$SECONDS; }

# MariaDB, PostgreSQL, Redis, RabbitMQ and NATS, each started if installed
# and down.
bash scripts/services.sh || true
echo "test.sh: MySQL DSN for tests: $dsn"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n "$unformatted" ]]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
# Every module of the workspace (go.work): the root module and the adapters,
# stores, examples and programs that are modules of their own.
all=github.com/orderguard/idempotency/...
took "gofmt"
# -vet=all runs every analyzer go vet runs, over every package (those without
# tests too), on the race build: a separate go vet would compile every
# dependency a second time without -race, about two minutes on a cold cache.
go test -race -vet=all -count=1 -timeout 20m "$all"
took "go vet and the whole suite under -race"

# The MySQL-dependent suites again with MariaDB's innodb_snapshot_isolation
# ON (the default since MariaDB 11.6.2; a session variable on 10.6.18+ and
# 10.11.8+, which go-sql-driver sets from a DSN parameter). Data races do not
# depend on the server's setting, so this pass runs without -race; being the
# root package's one build without it, it also runs each of the root
# package's benchmarks once (idembench measures them).
# With IDEMPOTENCY_TEST_MYSQL_DSN set, the pass runs when
# IDEMPOTENCY_TEST_SNAPSHOT_ISOLATION=1 says that server has the variable.
snapshot_isolation() {
  sep='?'; [[ "$dsn" == *\?* ]] && sep='&'
  # The setting changes what the store's statements see inside the business
  # transaction: the root package's suites (the store, the middleware, its
  # faults and chaos), the order service's transactions and the migrations
  # are where that shows; the front-ends and programs above them run the
  # same statements. -short loads the purge-under-load spec with 10^5
  # expired records (the -race pass above with 2.5 x 10^5); its assertions
  # hold at any size. 10^6 runs without either (go test -run
  # TestChaos_PurgeUnderLoad .), and idembench's B4 measures the purge
  # beside writers at 10^7.
  echo "test.sh: MySQL suites with innodb_snapshot_isolation=ON"
  IDEMPOTENCY_TEST_MYSQL_DSN="${dsn}${sep}innodb_snapshot_isolation=ON" \
    go test -short -count=1 -timeout 20m -bench=. -benchtime=1x -skip=SideBySide github.com/orderguard/idempotency \
      github.com/orderguard/idempotency/examples/orderservice/... github.com/orderguard/idempotency/migrations/...
}
if [[ "${IDEMPOTENCY_TEST_SNAPSHOT_ISOLATION:-}" == 1 ]] || { [[ -z "${IDEMPOTENCY_TEST_MYSQL_DSN:-}" ]] &&
   mysql -uroot -h127.0.0.1 -P3306 -N -e 'SELECT @@innodb_snapshot_isolation' >/dev/null 2>&1; }; then
  snapshot=1
elif [[ "${CI:-}" == "true" ]]; then
  echo "test.sh: the server has no innodb_snapshot_isolation; CI needs MariaDB 10.6.18+" >&2
  exit 1
fi

# The PostgreSQL store's specs whose path depends on how the COMMIT is sent
# (the store's conformance, storms, takeovers and fencing, commits lost or
# late, round trips, isolation, the reconciler) again over pgx's own
# database/sql driver, as for a service that opened its *sql.DB itself:
# pgtest's pools come from postgres.OpenDB otherwise, whose connections
# send single-phase's record with the COMMIT. Races were checked in the
# pass above.
stdlib() {
  echo "test.sh: PostgreSQL suites over pgx's stdlib driver"
  IDEMPOTENCY_TEST_POSTGRES_DRIVER=stdlib go test -count=1 -timeout 20m \
    -run 'TestStore_Conformance|TestStorm|TestTakeover|TestFencing|TestOpenDB|TestSinglePhase|TestChaos|TestRoundTrips|TestIsolation|TestSerializable|TestReconciler' \
    github.com/orderguard/idempotency/postgres
}

if [[ -n "${snapshot:-}" ]]; then
  snapshot_isolation
  took "the MySQL suites with innodb_snapshot_isolation=ON"
fi
stdlib
took "the PostgreSQL suites over pgx's stdlib driver"
