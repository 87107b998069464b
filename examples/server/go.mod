module github.com/orderguard/idempotency/examples/server

go 1.26.8

require github.com/orderguard/idempotency v0.0.0

require (
	github.com/orderguard/idempotency/examples/internal/dburl v0.0.0
	github.com/orderguard/idempotency/sqlite v0.0.0
)

require (
	github.com/getkin/kin-openapi v0.153.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/orderguard/idempotency/metrics v0.0.0
	github.com/orderguard/idempotency/postgres v0.0.0
	github.com/prometheus/client_golang v1.25.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stretchr/testify v1.12.1
	github.com/stripe/stripe-go/v82 v82.5.1
)

require (
	github.com/google/jsonschema-go v0.4.3 // indirect
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0 // indirect
	github.com/yosida95/uritemplate/v3 v3.0.2 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-openapi/jsonpointer v0.22.5 // indirect
	github.com/go-openapi/swag/jsonname v0.25.5 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/gorilla/mux v1.8.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/modelcontextprotocol/go-sdk v1.8.0
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/orderguard/idempotency/examples/internal/cli v0.0.0
	github.com/orderguard/idempotency/payment/standard v0.0.0
	github.com/orderguard/idempotency/payment/stripe v0.0.0
	github.com/orderguard/idempotency/redis v0.0.0
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	go.yaml.in/yaml/v4 v4.0.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace github.com/orderguard/idempotency => ../..

replace github.com/orderguard/idempotency/sqlite => ../../sqlite

replace github.com/orderguard/idempotency/metrics => ../../metrics

replace github.com/orderguard/idempotency/postgres => ../../postgres

replace github.com/orderguard/idempotency/examples/internal/dburl => ../internal/dburl

replace github.com/orderguard/idempotency/redis => ../../redis

replace github.com/orderguard/idempotency/payment/stripe => ../../payment/stripe

replace github.com/orderguard/idempotency/payment/standard => ../../payment/standard

replace github.com/orderguard/idempotency/examples/internal/cli => ../internal/cli
