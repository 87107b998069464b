#!/usr/bin/env bash
# Measures whether the example server's Redis pre-filter holds at start-up:
# starts `examples/server -redis ADDR` N times, each time sends the first
# requests right after /healthz answers (new keys and their replays), and
# reads the server's shared-cache metrics: how often Redis was marked down
# (idempotency_shared_cache_downs_total > 0) and how often a call failed
# (idempotency_shared_cache_fail_opens_total > 0). With -busy (the default)
# a shell loop keeps one core busy throughout, as other work would on a
# two-core machine.
#
#   bash scripts/redis-startup.sh                 # 20 starts, -redis-timeout as the server defaults
#   bash scripts/redis-startup.sh -n 30 -timeout 20ms
#   bash scripts/redis-startup.sh -busy=false
#
# Environment: REDIS_ADDR (default 127.0.0.1:6379). Needs curl and a Redis.
# Everything it writes (the server binary, an SQLite file, logs) lives in a
# temporary directory removed at exit. Exit status 0 when every start kept
# Redis up, 1 otherwise.
set -euo pipefail

n=20
timeout=""
busy=true
requests=10
while [ $# -gt 0 ]; do
	case "$1" in
	-n) n="$2"; shift 2 ;;
	-timeout) timeout="$2"; shift 2 ;;
	-busy=false) busy=false; shift ;;
	-busy | -busy=true) busy=true; shift ;;
	-requests) requests="$2"; shift 2 ;;
	*) echo "usage: $0 [-n STARTS] [-timeout D] [-busy=false] [-requests N]" >&2; exit 2 ;;
	esac
done
redis_addr="${REDIS_ADDR:-127.0.0.1:6379}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
busy_pid=""
server_pid=""
cleanup() {
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
	[ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

(cd "$root/examples/server" && go build -o "$work/server" .)
port=$((20000 + RANDOM % 20000))
addr="127.0.0.1:$port"
args=(-addr "$addr" -db "sqlite://$work/orders.db" -redis "$redis_addr" -reconcile-interval 0 -purge-interval 0)
[ -n "$timeout" ] && args+=(-redis-timeout "$timeout")

if $busy; then
	bash -c 'while :; do :; done' &
	busy_pid=$!
fi

metric() { # metric NAME FILE: the value of the sample NAME{cache="redis"}
	awk -v m="$1{cache=\"redis\"}" '$1 == m { print $2 }' "$2"
}

run_id="$(date +%s)-$$"
downs_runs=0
fail_runs=0
for i in $(seq 1 "$n"); do
	"$work/server" "${args[@]}" >"$work/server-$i.log" 2>&1 &
	server_pid=$!
	for _ in $(seq 1 500); do
		curl -sf -o /dev/null "http://$addr/healthz" && break
		sleep 0.02
	done
	for r in $(seq 1 "$requests"); do
		body="{\"user_id\":1001,\"sku_id\":$((20001 + r % 100)),\"quantity\":1}"
		for _ in 1 2; do # the create, then its retry
			curl -s -o /dev/null -X POST "http://$addr/orders" -H 'X-User-ID: 1001' \
				-H "Idempotency-Key: startup-$run_id-$i-$r" -H 'Content-Type: application/json' -d "$body"
		done
	done
	curl -s "http://$addr/metrics" >"$work/metrics-$i.txt"
	kill "$server_pid"
	wait "$server_pid" 2>/dev/null || true
	server_pid=""
	downs="$(metric idempotency_shared_cache_downs_total "$work/metrics-$i.txt")"
	fails="$(metric idempotency_shared_cache_fail_opens_total "$work/metrics-$i.txt")"
	if [ -z "$downs" ] || [ -z "$fails" ]; then
		echo "start $i: no shared-cache metrics; server log:" >&2
		cat "$work/server-$i.log" >&2
		exit 1
	fi
	warm="$(grep -o 'redis: connected.*' "$work/server-$i.log" | grep -o 'took=[^ ]*' || echo 'took=-')"
	echo "start $i: downs=$downs fail_opens=$fails warm-up $warm"
	[ "${downs%.*}" -gt 0 ] && downs_runs=$((downs_runs + 1))
	[ "${fails%.*}" -gt 0 ] && fail_runs=$((fail_runs + 1))
done
echo "redis-startup: $n starts (busy core: $busy, -redis-timeout ${timeout:-default}): marked down in $downs_runs, a failed call in $fail_runs"
[ "$downs_runs" -eq 0 ]
