module github.com/orderguard/idempotency/cmd/idembench

go 1.26.8

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/gofiber/fiber/v3 v3.1.0
	github.com/gofiber/storage/redis/v3 v3.4.3
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/orderguard/idempotency v0.0.0
	github.com/orderguard/idempotency/examples/grpcserver v0.0.0
	github.com/orderguard/idempotency/examples/orderconsumer v0.0.0
	github.com/orderguard/idempotency/grpc v0.0.0
	github.com/orderguard/idempotency/payment/standard v0.0.0
	github.com/orderguard/idempotency/redis v0.0.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/orderguard/idempotency/amqp v0.0.0 // indirect
	github.com/orderguard/idempotency/nats v0.0.0 // indirect
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/andybalholm/brotli v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/gofiber/schema v1.7.0 // indirect
	github.com/gofiber/utils/v2 v2.0.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/orderguard/idempotency/postgres v0.0.0
	github.com/orderguard/idempotency/sqlite v0.0.0
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/tinylib/msgp v1.6.3 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasthttp v1.69.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace github.com/orderguard/idempotency => ../..

replace github.com/orderguard/idempotency/sqlite => ../../sqlite

replace github.com/orderguard/idempotency/redis => ../../redis

replace github.com/orderguard/idempotency/postgres => ../../postgres

replace github.com/orderguard/idempotency/grpc => ../../grpc

replace github.com/orderguard/idempotency/examples/grpcserver => ../../examples/grpcserver

replace github.com/orderguard/idempotency/nats => ../../nats

replace github.com/orderguard/idempotency/amqp => ../../amqp

replace github.com/orderguard/idempotency/examples/orderconsumer => ../../examples/orderconsumer

replace github.com/orderguard/idempotency/examples/internal/dburl => ../../examples/internal/dburl

replace github.com/orderguard/idempotency/examples/internal/cli => ../../examples/internal/cli

replace github.com/orderguard/idempotency/payment/standard => ../../payment/standard
