// Package idemgrpc is the gRPC front-end of the idempotency protocol: a
// unary server interceptor that runs protected methods through
// idempotency.Middleware.Do, and a client interceptor that keeps one key
// across a call's retries and retries only what the contract calls
// retryable.
//
// # Server
//
// The key comes from the metadata idempotency-key (the header's syntax:
// idempotency.ParseKey), the scope from Method.Scope (the authenticated
// principal), the fingerprint from the request message (see Fingerprint).
// The method's handler runs inside the record's transaction
// (idempotency.TxFromContext), and its answer is recorded: a response
// message as the HTTP route of the same action writes it (proto field
// names, every known field, null for an unset one with presence, 64-bit
// integers as numbers), an error as application/problem+json carrying the
// exact google.rpc.Status, with the header metadata the handler set
// (grpc.SetHeader) as headers: Location, ETag and Config.ReplayHeaders are
// kept. A replay returns the recorded message, or the recorded status, with
// the recorded headers as header metadata and idempotent-replayed: true.
//
// The contract in gRPC's terms:
//
//	same key, other parameters      FAILED_PRECONDITION, ErrorInfo reason KEY_REUSED
//	another call holds the key      ABORTED, ErrorInfo IN_PROGRESS, RetryInfo
//	infrastructure fault            UNAVAILABLE, ErrorInfo STORE_UNAVAILABLE or
//	                                COMMIT_OUTCOME_UNKNOWN, RetryInfo
//	no key, bad key, bad message    INVALID_ARGUMENT, ErrorInfo MISSING_KEY, INVALID_KEY,
//	                                INVALID_MESSAGE or MESSAGE_TOO_LARGE
//	no principal                    UNAUTHENTICATED, ErrorInfo SCOPE_REQUIRED
//	the handler panicked            INTERNAL, ErrorInfo EXECUTION_FAILED
//
// every ErrorInfo in the domain "idempotency.orderguard" (ErrorDomain), with
// the problem's HTTP status, type and title in its metadata; a service's
// own problem kinds (ProblemStatus) are in ServiceDomain, or a domain of
// its own (ProblemStatusIn). An answer whose problem says when to retry
// carries a RetryInfo and the trailer grpc-retry-pushback-ms, which
// grpc-go's retry policy honours.
//
// A handler's own error is final, recorded and replayed, exactly when it
// would be over HTTP: a status that ProblemStatus made is recorded under
// its problem's own HTTP status (ErrorInfo metadata http_status), whatever
// its code; another under its code's (HTTPStatus): NOT_FOUND,
// ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE and
// UNAUTHENTICATED are final (a business answer: the same request gets it
// again); any other code rolls back, releases the key and is passed on, so
// that a retry executes again (INVALID_ARGUMENT among them, as HTTP's 400:
// the request was not acted on). The route's Config.IsFinalFunc decides
// over that status, as for HTTP. A handler's UNKNOWN, INTERNAL or
// DATA_LOSS is answered INTERNAL with a generic message, its own text
// logged (Config.Logger), never sent: it may hold a driver's SQL.
//
// # One action, any transport
//
// A Method can share the Middleware of the HTTP route that carries the
// same action, and name that route (Method.Route, "POST /orders"): its
// fingerprint is then the HTTP route's for the same business fields
// (idempotency.NewJSONFingerprint), so a key used over HTTP and retried
// over gRPC is replayed, or refused as reused with other parameters, never
// executed twice. A replay over gRPC of an answer recorded over HTTP decodes
// its JSON into the response message; a replay over HTTP of an answer
// recorded over gRPC is the HTTP route's own answer: its status
// (Method.OKStatus), its Location (the header metadata location the
// handler set) and its JSON.
//
// # Client
//
// UnaryClientInterceptor sends the key from WithKey, or one it makes per
// call (never per attempt), and retries under a client.Policy: the loop and
// the retryable answers of package client, with gRPC codes mapped to the
// HTTP answers they stand for (ContractAnswer). It retries only what the
// server marked retryable: grpc-go's own RESOURCE_EXHAUSTED for a message
// over a size limit is final.
package idemgrpc
