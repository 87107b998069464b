// Package client is the caller's half of the orderguard idempotency contract:
// it derives Idempotency-Key values and retries create-order requests safely.
//
// # Keys
//
// The server executes a business action at most once per key and replays the
// stored answer for every later request with that key. Safety therefore rests
// on the caller sending the same key for every retry of one action:
//
//   - a network retry, a tool re-execution, a re-plan of the same intent and a
//     resumed conversation all reuse the key;
//   - only a genuinely new user intent gets a new key.
//
// Use [KeyFor] when the action has stable identifiers (a run or conversation
// id and a tool-call or intent id): the key is recomputed identically after a
// crash or a restart, so nothing needs to be persisted. Use [NewKey] only when
// no such identifiers exist, and persist the key with the intent before the
// first attempt; generating a fresh key per attempt defeats the protection.
//
// # Retries
//
// [Transport] (an http.RoundTripper) and [Client.Do] share one retry loop.
// They never invent or replace a key: a request without one fails with
// [ErrNoKey] before anything is sent. The body is buffered once so every
// attempt carries identical bytes, because the server rejects a reused key
// whose request differs (key-reused, 409 or 422).
//
// Retried: transport errors (unless the caller's context is done), 409 whose
// problem kind is in-progress, 429, 502, 503 and 504. Everything else is a
// final answer and is returned as is: notably key-reused, every other 4xx, and
// 500, which is never retried automatically.
//
// Between attempts the loop waits for the server's Retry-After (seconds or an
// HTTP-date) when it is present and positive, and otherwise for a full-jitter
// exponential backoff, rand × min(MaxDelay, InitialDelay × 2^n) before the
// (n+2)th attempt. A Retry-After is not capped by MaxDelay because the server
// knows when retrying can succeed. No attempt starts later than MaxElapsed
// after the first: when the next wait would not fit, the loop stops
// immediately and returns the last response unchanged, or, when the last
// attempt ended in a transport error, an error wrapping [ErrGaveUp] and that
// error.
package client
