module github.com/orderguard/idempotency

go 1.26.8

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2
	github.com/anishathalye/porcupine v1.3.1
	github.com/go-sql-driver/mysql v1.10.1
	github.com/stretchr/testify v1.12.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
