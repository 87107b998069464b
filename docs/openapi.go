// Package docs carries the documents that describe the example order API to
// machines, embedded so that programs serve exactly what the repository
// holds.
package docs

import _ "embed"

// OpenAPI is docs/openapi.yaml: the OpenAPI 3.1 description of the example
// order API (examples/orderservice) with its idempotency contract — the
// Idempotency-Key and X-User-ID headers, every answer and problem type, and
// for each answer whether a client may retry it with the same key
// (x-retryable, x-retryable-by-type). The example server serves it at
// GET /openapi.yaml. Treat it as read-only.
//
//go:embed openapi.yaml
var OpenAPI []byte
