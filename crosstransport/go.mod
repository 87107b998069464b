module github.com/orderguard/idempotency/crosstransport

go 1.26.8

require (
	github.com/gin-gonic/gin v1.12.0
	github.com/labstack/echo/v4 v4.16.0
	github.com/orderguard/idempotency v0.0.0
	github.com/orderguard/idempotency/adapters/echo v0.0.0
	github.com/orderguard/idempotency/adapters/gin v0.0.0
	github.com/orderguard/idempotency/examples/grpcserver v0.0.0
	github.com/orderguard/idempotency/examples/orderconsumer v0.0.0
	github.com/orderguard/idempotency/grpc v0.0.0
	github.com/orderguard/idempotency/postgres v0.0.0
	github.com/stretchr/testify v1.12.1
	google.golang.org/grpc v1.85.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/bytedance/gopkg v0.1.3 // indirect
	github.com/bytedance/sonic v1.15.0 // indirect
	github.com/bytedance/sonic/loader v0.5.0 // indirect
	github.com/cloudwego/base64x v0.1.6 // indirect
	github.com/gabriel-vasile/mimetype v1.4.12 // indirect
	github.com/gin-contrib/sse v1.1.0 // indirect
	github.com/go-playground/locales v0.14.1 // indirect
	github.com/go-playground/universal-translator v0.18.1 // indirect
	github.com/go-playground/validator/v10 v10.30.1 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/goccy/go-json v0.10.5 // indirect
	github.com/goccy/go-yaml v1.19.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	github.com/labstack/gommon v0.5.0 // indirect
	github.com/leodido/go-urn v1.4.0 // indirect
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/nats-io/nats.go v1.55.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/orderguard/idempotency/amqp v0.0.0 // indirect
	github.com/orderguard/idempotency/nats v0.0.0 // indirect
	github.com/pelletier/go-toml/v2 v2.2.4 // indirect
	github.com/quic-go/qpack v0.6.0 // indirect
	github.com/quic-go/quic-go v0.59.0 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
	github.com/twitchyliquid64/golang-asm v0.15.1 // indirect
	github.com/ugorji/go/codec v1.3.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasttemplate v1.2.2 // indirect
	go.mongodb.org/mongo-driver/v2 v2.5.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/arch v0.22.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/orderguard/idempotency => ..
	github.com/orderguard/idempotency/adapters/echo => ../adapters/echo
	github.com/orderguard/idempotency/adapters/gin => ../adapters/gin
	github.com/orderguard/idempotency/amqp => ../amqp
	github.com/orderguard/idempotency/examples/grpcserver => ../examples/grpcserver
	github.com/orderguard/idempotency/examples/internal/dburl => ../examples/internal/dburl
	github.com/orderguard/idempotency/examples/orderconsumer => ../examples/orderconsumer
	github.com/orderguard/idempotency/grpc => ../grpc
	github.com/orderguard/idempotency/nats => ../nats
	github.com/orderguard/idempotency/postgres => ../postgres
	github.com/orderguard/idempotency/sqlite => ../sqlite
)
