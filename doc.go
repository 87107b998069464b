// Package idempotency makes order creation idempotent for HTTP services and
// the AI agents that call them: a retried, replayed or re-planned request can
// never create a second order, and every retry gets the first answer back.
//
// Wrap the create-order handler:
//
//	store := idempotency.NewMySQLStore(db) // or sqlite.NewStore(db)
//	mw, err := idempotency.New(store, &idempotency.Config{
//		ScopeFunc:   func(r *http.Request) (string, error) { return userFrom(r) },
//		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"user_id", "sku_id", "quantity", "coupon_id"}},
//	})
//	mux.Handle("POST /orders", mw.Handler(createOrder))
//
// and do the business writes in the request's transaction:
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx, _ := idempotency.TxFromContext(r.Context())
//		... write the order with tx; do not commit ...
//		w.WriteHeader(http.StatusCreated)
//	}
//
// # The protocol
//
// Each request walks these steps (see idempotency.go, one function each):
//
//  1. Key: the Idempotency-Key header, 1–255 visible ASCII characters (plain
//     or as an RFC 8941 sf-string). The caller holds one key per business
//     action and reuses it for every retry.
//  2. Scope: Config.ScopeFunc names the principal; records are unique per
//     (scope, key).
//  3. Fingerprint: SHA-256 over the method, the canonical route and the
//     canonical JSON body (or an allow-list of its fields). The same key with
//     a different fingerprint is a conflict (409, or 422 if configured).
//  4. Claim: a plain INSERT of a PROCESSING record under a lease; the primary
//     key (scope, key) lets exactly one concurrent request win.
//  5. Execute: the handler runs in a transaction (TxFromContext) with a
//     recording ResponseWriter.
//  6. Finalize: a 2xx or 3xx finishes the record with the response snapshot
//     inside the same transaction, then commits: the order and its snapshot
//     commit together or not at all. A final 4xx rolls back and is stored as
//     FAILED. A 5xx, a 400 (see DefaultIsFinal), a panic or a database fault
//     rolls back and releases the key.
//  7. Respond: duplicates get the stored answer (Idempotent-Replayed: true),
//     in-progress (409 with Retry-After), or the conflict.
//
// ModeSinglePhase skips the claim and inserts the finished record as the last
// statement of the business transaction: faster, and a crash leaves nothing
// behind for a new key, for handlers whose every effect is in the database.
//
// Leases are fenced by a version that every change bumps, so an attempt
// whose lease was taken over can never commit, release or overwrite its
// successor's work. A Reconciler settles claims left by crashed processes;
// Purge deletes records past retention.
//
// Errors are answered as RFC 9457 problem+json with a stable type per kind
// (ProblemTypePrefix + ProblemMissingKey, ...). A fault of the
// infrastructure is answered 503 (or 409 in-progress) with Retry-After,
// never 500: 500 is left for the handler's own failure. Handlers classify
// their own database errors with IsTransient. Library errors match
// sentinels with errors.Is.
package idempotency
