// Package crosstransport holds the cross-transport matrix: one action,
// any transport. The example order service is served at once over
// net/http, gin, echo, gRPC, NATS JetStream and RabbitMQ on one database,
// and every operation that several transports carry (create, cancel) is
// sent with one key over every ordered pair of them: the first executes,
// the second replays the same answer in its own terms, and the action has
// exactly one effect. It is a module of its own because it imports every
// front-end; it has no code but its tests.
package crosstransport
