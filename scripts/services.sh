#!/usr/bin/env bash
# Starts the local services the suites talk to, each only if it is installed
# and not answering: MariaDB (3306), PostgreSQL (5432), Redis (6379),
# RabbitMQ (5672) and NATS with JetStream (4222), with the commands Debian's
# packages install. A service that is not installed is left alone: its
# suites skip with a message, or fail when CI=true requires them.
#
#   scripts/services.sh            ensure every service answers
#   scripts/services.sh mysql ...  only these (mysql postgres redis rabbitmq nats)
#
# Set IDEMPOTENCY_TEST_MYSQL_DSN (or the other suites' variables) to test
# against servers elsewhere: then nothing is started for them.
set -uo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port seconds
  for _ in $(seq 1 "$3"); do listening "$2" && return 0; sleep 1; done
  echo "services.sh: $1 did not answer on 127.0.0.1:$2 within $3s" >&2
  return 1
}

mysql_up() {
  [[ -n "${IDEMPOTENCY_TEST_MYSQL_DSN:-}" ]] && return 0
  if ! mysqladmin --connect-timeout=2 -uroot -h127.0.0.1 -P3306 ping >/dev/null 2>&1 && [[ -x /usr/sbin/mariadbd ]]; then
    echo "services.sh: starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    for _ in $(seq 1 60); do mysqladmin --connect-timeout=2 -uroot -h127.0.0.1 -P3306 ping >/dev/null 2>&1 && break; sleep 1; done
  fi
  if command -v mysql >/dev/null; then
    mysql -uroot -h127.0.0.1 -P3306 -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null || true
  fi
}

postgres_up() {
  [[ -n "${IDEMPOTENCY_TEST_POSTGRES_DSN:-}" ]] && return 0
  if ! listening 5432 && command -v pg_ctlcluster >/dev/null; then
    echo "services.sh: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    wait_for PostgreSQL 5432 60
  fi
}

redis_up() {
  if ! listening 6379 && command -v redis-server >/dev/null; then
    echo "services.sh: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir "${TMPDIR:-/tmp}" --logfile "${TMPDIR:-/tmp}/redis-ci.log" || true
    wait_for Redis 6379 30
  fi
}

rabbitmq_up() {
  if ! listening 5672 && command -v rabbitmq-server >/dev/null; then
    echo "services.sh: starting RabbitMQ"
    rabbitmq-server -detached || true
    wait_for RabbitMQ 5672 90
  fi
}

nats_up() {
  if ! listening 4222 && [[ -x /usr/sbin/nats-server ]]; then
    echo "services.sh: starting NATS"
    mkdir -p /var/lib/nats-server 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    wait_for NATS 4222 30
  fi
}

services=("$@")
[[ ${#services[@]} -gt 0 ]] || services=(mysql postgres redis rabbitmq nats)
status=0
for s in "${services[@]}"; do
  case "$s" in
    mysql|postgres|redis|rabbitmq|nats) "${s}_up" || status=1 ;;
    *) echo "services.sh: unknown service $s" >&2; status=2 ;;
  esac
done
exit $status
