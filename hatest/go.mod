module github.com/orderguard/idempotency/hatest

go 1.26.8

replace (
	github.com/orderguard/idempotency => ..
	github.com/orderguard/idempotency/postgres => ../postgres
)

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/orderguard/idempotency v0.0.0
	github.com/orderguard/idempotency/postgres v0.0.0
	github.com/stretchr/testify v1.12.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
