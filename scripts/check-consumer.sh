#!/usr/bin/env bash
# Builds a throwaway consumer module that imports only the root package (as a
# service adopting the library does) and fails if its module graph holds
# anything beyond go-sql-driver/mysql with its own dependencies and the root
# module's test-only dependencies (go-sqlmock, testify and theirs, and
# porcupine, which only internal/history uses, for the fault specs' history
# checks; it has no dependencies of its own), or if the consumer's binary
# links any module but the root module and go-sql-driver/mysql with its own.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
cat >go.mod <<MOD
module example.com/consumer

go 1.26.8

require github.com/orderguard/idempotency v0.0.0

replace github.com/orderguard/idempotency => $repo
MOD
cat >main.go <<'GO'
package main

import (
	"database/sql"
	"log"
	"net/http"

	"github.com/orderguard/idempotency"
)

func main() {
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), nil)
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /orders", mw.Handler(http.NotFoundHandler()))
}
GO
export GOWORK=off GOFLAGS=-mod=mod
go mod tidy >/dev/null
go build -o consumer .
allowed='^(example\.com/consumer|github\.com/orderguard/idempotency|github\.com/go-sql-driver/mysql|filippo\.io/edwards25519|github\.com/anishathalye/porcupine|github\.com/DATA-DOG/go-sqlmock|github\.com/stretchr/testify|github\.com/stretchr/objx|github\.com/davecgh/go-spew|github\.com/pmezard/go-difflib|go\.yaml\.in/yaml/v3|gopkg\.in/yaml\.v3|gopkg\.in/check\.v1|github\.com/kr/pretty|github\.com/kr/text|github\.com/rogpeppe/go-internal)( |$)'
graph=$(go list -m all)
extra=$(grep -Ev "$allowed" <<<"$graph" || true)
echo "check-consumer: a module importing only the root package has $(wc -l <<<"$graph") modules in its graph:"
sed 's/^/  /' <<<"$graph"
if [[ -n "$extra" ]]; then
  echo "check-consumer: beyond go-sql-driver/mysql and the test-only dependencies:" >&2
  sed 's/^/  /' <<<"$extra" >&2
  exit 1
fi
linked=$(go version -m consumer | awk '$1 == "dep" { print $2 }')
unexpected=$(grep -Ev '^(github\.com/orderguard/idempotency|github\.com/go-sql-driver/mysql|filippo\.io/edwards25519)$' <<<"$linked" || true)
echo "check-consumer: its binary links:"
sed 's/^/  /' <<<"$linked"
if [[ -n "$unexpected" ]]; then
  echo "check-consumer: the binary links modules beyond the root module and go-sql-driver/mysql:" >&2
  sed 's/^/  /' <<<"$unexpected" >&2
  exit 1
fi
