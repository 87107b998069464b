#!/usr/bin/env bash
# Hunts flaky specs: runs packages' tests again and again, in shuffled order,
# at GOMAXPROCS 1 and 2, and with -burn while a CPU-burning process keeps one
# core busy (as when CI shares the machine). Each round is one `go test`
# process per package running every test count × 2 times; a failing round's
# log is kept. The summary says how many runs of its whole suite each package
# survived.
#
#   scripts/flake.sh [-rounds N] [-count C] [-burn] [-race] [-out DIR] [package ...]
#
# Without packages it hunts in the timing-sensitive ones (below). It needs
# the services the suites need (scripts/test.sh starts MariaDB if down).
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=5 count=5 burn=0 race="" out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -rounds) rounds="$2"; shift 2 ;;
    -count) count="$2"; shift 2 ;;
    -burn) burn=1; shift ;;
    -race) race=-race; shift ;;
    -out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "flake.sh: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
mod=github.com/orderguard/idempotency
pkgs=("$@")
if [[ ${#pkgs[@]} -eq 0 ]]; then
  pkgs=("$mod" "$mod/redis" "$mod/postgres" "$mod/examples/server" "$mod/examples/mcpserver"
    "$mod/examples/agentsim" "$mod/internal/faultproxy" "$mod/adapters/gin" "$mod/adapters/echo"
    "$mod/sqlite" "$mod/client" "$mod/metrics" "$mod/grpc" "$mod/examples/grpcserver" "$mod/postgres/pgtest"
    "$mod/examples/grpcserver/ordergrpc" "$mod/queue" "$mod/nats" "$mod/amqp"
    "$mod/examples/orderconsumer" "$mod/examples/orderconsumer/orderqueue")
fi
out="${out:-$(mktemp -d -t flake.XXXXXX)}"
mkdir -p "$out"

burner=""
if [[ $burn == 1 ]]; then
  # One process spinning on one core: the other core stays for the suite,
  # which then competes with it for CPU, as beside a busy neighbour.
  bash -c 'while :; do :; done' &
  burner=$!
  trap 'kill $burner 2>/dev/null' EXIT
  echo "flake.sh: burning one core (pid $burner)"
fi

declare -A runs fails
start=$SECONDS
for ((r = 1; r <= rounds; r++)); do
  for p in "${pkgs[@]}"; do
    log="$out/$(basename "$p")-round$r.log"
    t0=$SECONDS
    CI=true go test $race -count="$count" -shuffle=on -cpu 1,2 -timeout 60m "$p" >"$log" 2>&1
    rc=$?
    n=$((count * 2))
    failed=$(grep -c -- '^--- FAIL' "$log")
    runs[$p]=$(( ${runs[$p]:-0} + n ))
    if [[ $rc -ne 0 ]]; then
      fails[$p]=$(( ${fails[$p]:-0} + 1 ))
      echo "flake.sh: round $r $p FAILED in $((SECONDS - t0))s ($failed failing tests; $log):"
      grep -- '--- FAIL\|-test.shuffle' "$log" | head -20 | sed 's/^/    /'
    else
      rm -f "$log"
      echo "flake.sh: round $r $p ok in $((SECONDS - t0))s ($n runs)"
    fi
  done
done

echo "flake.sh: summary after $((SECONDS - start))s (burn=$burn${race:+, race}); failing logs in $out"
status=0
for p in "${pkgs[@]}"; do
  printf '  %-55s %4d runs, %d failing rounds\n' "$p" "${runs[$p]}" "${fails[$p]:-0}"
  [[ ${fails[$p]:-0} -eq 0 ]] || status=1
done
exit $status
