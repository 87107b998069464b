#!/usr/bin/env bash
# Model-checks the idempotency protocol with SPIN (model/, see model/README.md):
# the model's exhaustive safety and liveness checks must pass, and every
# mutant (the protocol with one safeguard removed, including the two the model
# found missing in the code) must make SPIN find a counterexample, or the
# model would prove nothing.
#
# Prints, for each run: the states stored, the depth reached, the errors,
# the search's wall and CPU seconds, and the result (for a counterexample,
# the property it breaks). Exits non-zero if a check of the model fails or is incomplete, or
# if a mutant survives. Installs Debian's spin package if it is missing.
#
#   scripts/spin.sh            every run (two at a time)
#   scripts/spin.sh NAME...    the named runs only (see RUNS below)
#   SPIN_JOBS=1 scripts/spin.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v spin >/dev/null; then
  echo "spin: installing Debian's spin package" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin; } >/dev/null 2>&1 \
     || ! command -v spin >/dev/null; then
    echo "spin: SPIN is not installed and apt-get could not install it (install the 'spin' package)" >&2
    exit 1
  fi
fi
command -v gcc >/dev/null || { echo "spin: gcc is needed to compile SPIN's verifiers" >&2; exit 1; }

# no fault of any kind, unless a run names it
ONLY="-DCRASHES=0 -DFAULTS=0 -DLOSTCOMMIT=0 -DSLOW=0 -DFAILS=0 -DRENEW=0"

# name | check | expect | defines
#   check: safety (assertions, exhaustive) or liveness (ltl final, weak fairness)
#   expect: pass (no error, search complete) or fail (a counterexample)
RUNS=(
  "claimfirst|safety|pass|-DNCLI=2 -DFT=2"
  "live-claimfirst|liveness|pass|-DNCLI=2 -DFP1=1 -DFT=1"
  "singlephase|safety|pass|-DNCLI=2 -DFT=2 -DSINGLEPHASE"
  "live-singlephase|liveness|pass|-DNCLI=2 -DFP1=1 -DFT=1 -DSINGLEPHASE"
  "shared|safety|pass|-DNCLI=2 -DFT=1 -DSHARED -DSTALE -DSINGLEPHASE"
  "live-markers|liveness|pass|-DNCLI=2 -DFP1=1 -DFT=1 -DMARKERS $ONLY -DRFAULTS=1 -DNORECONCILER"
  "three|safety|pass|-DNCLI=3 -DFT=0"
  "mutant-unfenced-finish|safety|fail|-DNCLI=2 -DFT=1 -DMUTANT_UNFENCED_FINISH"
  "mutant-no-unique-index|safety|fail|-DNCLI=2 -DFT=0 -DMUTANT_NO_UNIQUE_INDEX"
  "mutant-no-unique-index-sp|safety|fail|-DNCLI=2 -DFT=0 -DMUTANT_NO_UNIQUE_INDEX -DSINGLEPHASE"
  "mutant-replay-before-commit|safety|fail|-DNCLI=2 -DFT=1 -DMUTANT_REPLAY_BEFORE_COMMIT"
  "mutant-cache-before-commit|safety|fail|-DNCLI=2 -DFT=1 -DMUTANT_CACHE_BEFORE_COMMIT -DSINGLEPHASE"
  "mutant-takeover-unexpired|safety|fail|-DNCLI=2 -DFT=1 -DMUTANT_TAKEOVER_UNEXPIRED"
  "env-no-expiry|liveness|fail|-DNCLI=2 -DFP1=1 -DFT=1 -DENV_NO_EXPIRY"
  "mutant-rejection-after-lost-lease|safety|fail|-DMUTANT_REJECTION_AFTER_LOST_LEASE -DNCLI=2 -DFP1=1 -DFT=2 $ONLY -DSLOW=1 -DFAULTS=1"
  "mutant-reused-owner|safety|fail|-DMUTANT_REUSED_OWNER -DNCLI=2 -DFP1=1 -DFT=3 $ONLY -DSLOW=1 -DFAULTS=1 -DFAILS=1"
)

jobs=${SPIN_JOBS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME CHECK DEFINES: compiles and runs one verifier in its own
# directory; leaves pan's output in $work/NAME/out.
run() {
  local name=$1 check=$2 defines=$3 dir=$work/$1
  mkdir -p "$dir" && cp model/*.pml "$dir" && cd "$dir"
  local cflags="-DSAFETY -DNOCLAIM" flags="-m100000 -w24"
  if [[ $check == liveness ]]; then cflags="-DNFAIR=3"; flags="-a -f -m100000 -w23"; fi
  # shellcheck disable=SC2086 # defines are words
  if ! spin -a $defines idempotency.pml >spin.log 2>&1; then
    cat spin.log >out; return
  fi
  # -O0: the verifier's code is large and compiles several times faster,
  # which pays for its slower search on runs of this size.
  # shellcheck disable=SC2086
  gcc -O0 -w -DNOBOUNDCHECK -DMEMLIM=1536 $cflags -o pan pan.c >gcc.log 2>&1 || { cat gcc.log >out; return; }
  local TIMEFORMAT='%R %U'
  # shellcheck disable=SC2086
  { time ./pan $flags >out 2>&1; } 2>time || true
  echo "time $(cat time)" >>out
  # a counterexample: replay it to name the property (the /* Sn */ tag on
  # the line of the assertion that failed)
  if [[ -f idempotency.pml.trail ]]; then
    # shellcheck disable=SC2086
    spin -t $defines idempotency.pml 2>&1 | sed -nE 's/^spin: ([a-z]+\.pml):([0-9]+), Error: .*/\1 \2/p' | head -1 >where || true
    if [[ -s where ]]; then
      read -r file line <where
      echo "property $(sed -n "${line}p" "$file" | grep -oE '/\* (S[0-9]|M)[^*]*\*/' | head -1)" >>out
    fi
  fi
}

only=("$@")
selected=()
for r in "${RUNS[@]}"; do
  name=${r%%|*}
  if ((${#only[@]})); then
    [[ " ${only[*]} " == *" $name "* ]] || continue
  fi
  selected+=("$r")
done
((${#selected[@]})) || { echo "spin: no run named ${only[*]}" >&2; exit 1; }

total_start=$SECONDS
running=0
for r in "${selected[@]}"; do
  IFS='|' read -r name check expect defines <<<"$r"
  (run "$name" "$check" "$defines") &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n; running=$((running - 1)); fi
done
wait

# describe OUT: the property a counterexample breaks
describe() {
  local prop
  prop=$(sed -nE 's|^property /\* (S[0-9]\|M)(.*)\*/|\1|p' "$1" | head -1)
  if grep -q 'acceptance cycle' "$1"; then
    echo "L (ltl final: every client gets a final answer and no key stays PROCESSING)"
  elif [[ -n $prop ]]; then
    echo "$prop (${PROPS[$prop]:-?})"
  else
    grep -m1 -E '^pan:1:' "$1" | sed -E 's/^pan:1: //; s/ \(at depth [0-9]+\)//'
  fi
}
declare -A PROPS=(
  [S1]="at most one order per key and retention period"
  [S2]="a success answer is the committed order of its request"
  [S3]="no rejection or conflict for a request whose order is committed"
  [S4]="an order commits only with its own request's record"
  [S5]="no two handlers of a key run at once unless one outlived its lease"
  [M]="a bound of the model itself"
)

status=0
printf '%-30s %-9s %-7s %10s %6s %6s %6s %6s  %s\n' run check expect states depth errors secs cpu result
for r in "${selected[@]}"; do
  IFS='|' read -r name check expect defines <<<"$r"
  out=$work/$name/out
  states=$(sed -nE 's/^ *([0-9.e+]+) states, stored.*/\1/p' "$out" | head -1)
  depth=$(sed -nE 's/.*depth reached ([0-9]+).*/\1/p' "$out" | head -1)
  errors=$(sed -nE 's/.*errors: ([0-9]+).*/\1/p' "$out" | head -1)
  read -r secs cpu < <(sed -nE 's/^time ([0-9.]+) ([0-9.]+)$/\1 \2/p' "$out")
  result=ok
  if [[ -z $errors ]]; then
    result="FAILED: the verifier did not run"; status=1
  elif [[ $expect == pass ]]; then
    if ((errors > 0)); then
      result="FAILED: $(describe "$out")"; status=1
    elif grep -qE 'Search not completed|max search depth too small|out of memory' "$out"; then
      result="FAILED: the search did not complete"; status=1
    fi
  else
    if ((errors == 0)); then
      result="FAILED: SPIN found no counterexample; the model does not notice this change"; status=1
    else
      result="counterexample: $(describe "$out")"
    fi
  fi
  printf '%-30s %-9s %-7s %10s %6s %6s %6s %6s  %s\n' "$name" "$check" "$expect" "${states:--}" "${depth:--}" \
    "${errors:--}" "${secs:--}" "${cpu:--}" "$result"
  if [[ $result == FAILED* ]]; then
    sed 's/^/    /' "$out" | tail -25
    echo "    defines: $defines (model/README.md: how to replay a trail)"
  fi
done
echo "spin: ${#selected[@]} runs in $((SECONDS - total_start)) s, $jobs at a time (secs and cpu: the search alone;" \
  "SPIN $(spin -V | sed -nE 's/Spin Version ([0-9.]+).*/\1/p'))"
exit $status
