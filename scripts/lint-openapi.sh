#!/usr/bin/env bash
# Lints docs/openapi.yaml with Redocly CLI's recommended rules
# (docs/redocly.yaml; accepted exceptions, each with its reason, in
# docs/.redocly.lint-ignore.yaml). Fails on any error or warning.
#
#   bash scripts/lint-openapi.sh
#
# Redocly CLI runs through npx at a pinned version; npm keeps it in
# $IDEMPOTENCY_NPM_CACHE (default ~/.cache/idempotency-npm), outside the
# repository, so a second run needs no download and nothing is written in
# the clone. Needs node and npm (Node 20 or later).
set -euo pipefail

REDOCLY_CLI_VERSION=2.77.0

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export NPM_CONFIG_CACHE="${IDEMPOTENCY_NPM_CACHE:-$HOME/.cache/idempotency-npm}"
export NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true

redocly() {
	npx --yes "@redocly/cli@$REDOCLY_CLI_VERSION" "$@"
}

report="$(redocly lint --config docs/redocly.yaml --format=json docs/openapi.yaml 2>/dev/null || true)"
totals="$(node -e '
let s = "";
process.stdin.on("data", d => s += d).on("end", () => {
  try {
    const t = JSON.parse(s).totals;
    console.log(t.errors + " " + t.warnings);
  } catch (e) {
    console.log("unreadable");
  }
});' <<<"$report")"
if [ "$totals" = "0 0" ]; then
	echo "lint-openapi: docs/openapi.yaml is clean under Redocly CLI $REDOCLY_CLI_VERSION's recommended rules"
	exit 0
fi
# Show the problems readably (or why the JSON report was unreadable).
redocly lint --config docs/redocly.yaml --format=stylish docs/openapi.yaml || true
echo "lint-openapi: docs/openapi.yaml has problems (errors, warnings: ${totals})" >&2
exit 1
