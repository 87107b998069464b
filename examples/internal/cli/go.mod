module github.com/orderguard/idempotency/examples/internal/cli

go 1.26.8
