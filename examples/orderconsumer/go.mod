module github.com/orderguard/idempotency/examples/orderconsumer

go 1.26.8

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/orderguard/idempotency v0.0.0
	github.com/orderguard/idempotency/amqp v0.0.0
	github.com/orderguard/idempotency/examples/internal/dburl v0.0.0
	github.com/orderguard/idempotency/nats v0.0.0
	github.com/orderguard/idempotency/payment/standard v0.0.0
	github.com/orderguard/idempotency/postgres v0.0.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/orderguard/idempotency/examples/internal/cli v0.0.0
	github.com/orderguard/idempotency/sqlite v0.0.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace (
	github.com/orderguard/idempotency => ../..
	github.com/orderguard/idempotency/amqp => ../../amqp
	github.com/orderguard/idempotency/examples/internal/dburl => ../internal/dburl
	github.com/orderguard/idempotency/nats => ../../nats
	github.com/orderguard/idempotency/payment/standard => ../../payment/standard
	github.com/orderguard/idempotency/postgres => ../../postgres
	github.com/orderguard/idempotency/sqlite => ../../sqlite
)

replace github.com/orderguard/idempotency/examples/internal/cli => ../internal/cli
