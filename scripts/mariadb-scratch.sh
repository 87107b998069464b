#!/usr/bin/env bash
# A throw-away MariaDB server on a loopback port, for measurements that need
# server settings the shared server should keep (B4's buffer pool sized to
# hold 10M records, for one). Test use only: no password, loopback only,
# data thrown away by stop.
#
#   scripts/mariadb-scratch.sh start    start it (waits until it answers)
#   scripts/mariadb-scratch.sh dsn      print its DSN
#   scripts/mariadb-scratch.sh stop     shut it down and remove its directory
#
#   cd cmd/idembench && go run . -only b4 -mysql "$(../../scripts/mariadb-scratch.sh dsn)" ...
#
# Environment:
#   SCRATCH_DIR          state directory (default ${TMPDIR:-/tmp}/orderguard-scratch)
#   SCRATCH_PORT         SQL port (default 3398)
#   SCRATCH_BUFFER_POOL  innodb_buffer_pool_size (default 8G)
#   SCRATCH_LOG_FILE     innodb_log_file_size (default 1G)
# Every other setting is Debian's default, as on the shared server.
set -euo pipefail

dir="${SCRATCH_DIR:-${TMPDIR:-/tmp}/orderguard-scratch}"
port="${SCRATCH_PORT:-3398}"
marker=".orderguard-scratch" # stop removes only a directory this script made

client() { mariadb --no-defaults --protocol=TCP -h127.0.0.1 -P"$port" -uroot --connect-timeout=2 "$@"; }

case "${1:-}" in
start)
  if client -e 'SELECT 1' >/dev/null 2>&1; then exit 0; fi
  user=()
  [[ "$(id -u)" == 0 ]] && user=(--user=mysql)
  mkdir -p "$dir/data"
  touch "$dir/$marker"
  [[ "$(id -u)" == 0 ]] && chown -R mysql "$dir"
  if [[ ! -d "$dir/data/mysql" ]]; then
    mariadb-install-db --no-defaults "${user[@]}" --datadir="$dir/data" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
  fi
  mariadbd --no-defaults "${user[@]}" --datadir="$dir/data" --socket="$dir/mysqld.sock" \
    --pid-file="$dir/mysqld.pid" --port="$port" --bind-address=127.0.0.1 --skip-name-resolve \
    --innodb-buffer-pool-size="${SCRATCH_BUFFER_POOL:-8G}" --innodb-log-file-size="${SCRATCH_LOG_FILE:-1G}" \
    --innodb-flush-method=O_DIRECT --max-connections=500 >"$dir/server.log" 2>&1 &
  for _ in $(seq 60); do
    if client -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null; then exit 0; fi
    sleep 1
  done
  cat "$dir/server.log" >&2
  exit 1
  ;;
dsn) echo "root@tcp(127.0.0.1:$port)/test" ;;
stop)
  [[ -f "$dir/$marker" ]] || exit 0
  client -e 'SHUTDOWN' >/dev/null 2>&1 || true
  for _ in $(seq 60); do
    [[ -f "$dir/mysqld.pid" ]] && kill -0 "$(cat "$dir/mysqld.pid")" 2>/dev/null || break
    sleep 1
  done
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|dsn|stop" >&2
  exit 2
  ;;
esac
