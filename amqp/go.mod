module github.com/orderguard/idempotency/amqp

go 1.26.8

require (
	github.com/orderguard/idempotency v0.0.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/orderguard/idempotency => ..
