module github.com/orderguard/idempotency/examples/paysim

go 1.26.8

require (
	github.com/orderguard/idempotency v0.0.0
	github.com/orderguard/idempotency/examples/internal/dburl v0.0.0-00010101000000-000000000000
	github.com/orderguard/idempotency/payment/standard v0.0.0
	github.com/orderguard/idempotency/payment/stripe v0.0.0
	github.com/stripe/stripe-go/v82 v82.5.1
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
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/orderguard/idempotency/examples/internal/cli v0.0.0
	github.com/orderguard/idempotency/postgres v0.0.0 // indirect
	github.com/orderguard/idempotency/sqlite v0.0.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace github.com/orderguard/idempotency => ../..

replace github.com/orderguard/idempotency/examples/internal/dburl => ../internal/dburl

replace github.com/orderguard/idempotency/payment/standard => ../../payment/standard

replace github.com/orderguard/idempotency/payment/stripe => ../../payment/stripe

replace github.com/orderguard/idempotency/postgres => ../../postgres

replace github.com/orderguard/idempotency/sqlite => ../../sqlite

replace github.com/orderguard/idempotency/examples/internal/cli => ../internal/cli
