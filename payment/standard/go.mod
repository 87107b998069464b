module github.com/orderguard/idempotency/payment/standard

go 1.26.8

replace github.com/orderguard/idempotency => ../..

require (
	github.com/orderguard/idempotency v0.0.0
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0
	github.com/stretchr/testify v1.12.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
