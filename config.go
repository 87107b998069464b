package idempotency

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"
)

// Mode selects how a route records its outcome.
type Mode int

const (
	// ModeClaimFirst claims the key with a PROCESSING record in its own
	// statement before the handler runs, and finishes it inside the business
	// transaction. Concurrent duplicates are answered in-progress at once
	// (or wait InFlightWait). Use it for handlers with effects outside the
	// database (a payment API, a message): they run at most once per key
	// while the lease holds.
	ModeClaimFirst Mode = iota

	// ModeSinglePhase runs the handler first and inserts the finished record
	// at the end of the same transaction. No PROCESSING row exists for a new
	// key, so a crash leaves nothing behind, and there is one statement less
	// per request. (Renewing a key whose record is past retention goes the
	// claim-first way, briefly holding a PROCESSING record under a lease.) A concurrent duplicate also executes, then collides on the
	// record's primary key (or the order's unique key) at commit, rolls back
	// and replays the winner. Use it only for handlers whose every effect is
	// in the transaction.
	ModeSinglePhase
)

// String returns the mode's name: "claim-first" or "single-phase".
func (m Mode) String() string {
	switch m {
	case ModeClaimFirst:
		return "claim-first"
	case ModeSinglePhase:
		return "single-phase"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the mode a name (Mode.String) names, for flags and
// configuration files.
func ParseMode(name string) (Mode, error) {
	switch name {
	case "claim-first":
		return ModeClaimFirst, nil
	case "single-phase":
		return ModeSinglePhase, nil
	}
	return 0, fmt.Errorf("idempotency: mode %q: want claim-first or single-phase", name)
}

// Config configures a Middleware. The zero value is usable: every field has
// a default.
type Config struct {
	// Mode selects claim-first or single-phase recording. Defaults to
	// ModeClaimFirst.
	Mode Mode

	// ReplayCacheBytes bounds an in-process cache of finished snapshots,
	// checked with the fingerprint, that serves replays without a database
	// round trip. Only final records are cached (they never change before
	// their retention ends, which the cache respects). 0 means the default,
	// 8 MiB; a negative value turns the cache off.
	ReplayCacheBytes int64

	// Route names the protected route in observations (a bounded label such
	// as "create_order"). Defaults to "default".
	Route string

	// HeaderName is the request header carrying the key. Defaults to
	// "Idempotency-Key".
	HeaderName string

	// MaxKeyLength bounds the key's length. Defaults to 255, the most the
	// schema stores.
	MaxKeyLength int

	// KeyOptional lets requests without a key through, unprotected. Defaults
	// to false: a missing key is answered 400.
	KeyOptional bool

	// ScopeFunc returns the principal (user, tenant, API client) that owns
	// the request's key. Records are unique per (scope, key): a request from
	// another scope never sees, blocks or replays this scope's records. The
	// scope must be the principal's canonical identity, derived from what
	// authentication established and spelled one way: a raw header that
	// authentication parses ("7", "+7" and "007" for user 7) would make one
	// principal several scopes, and one action several orders. An error is
	// answered 401 (or as the *Problem it wraps). Defaults to the empty
	// scope for every request, which is safe for single-tenant services
	// only.
	ScopeFunc func(*http.Request) (string, error)

	// Operation declares the action's identity (its route and the
	// parameters that count) once for every front-end that shares this
	// Middleware: see Operation. With it set, Fingerprint and
	// FingerprintFunc must not be. Defaults to none: the fingerprint is
	// Fingerprint's or FingerprintFunc's, and other front-ends declare
	// their own.
	Operation *Operation

	// Fingerprint selects what the default fingerprint covers. Ignored when
	// FingerprintFunc is set. Defaults to method, canonical route and the
	// whole body.
	Fingerprint FingerprintConfig

	// FingerprintFunc replaces the default fingerprint.
	FingerprintFunc FingerprintFunc

	// MaxBodyBytes bounds the request body, which is read (through a limit)
	// before the claim to compute the fingerprint. Defaults to 1 MiB.
	MaxBodyBytes int64

	// MaxSnapshotBytes bounds a stored response body. A 2xx response larger
	// than this cannot be replayed, so the attempt is rolled back and
	// answered 500. Defaults to 1 MiB.
	MaxSnapshotBytes int

	// Lease is how long a PROCESSING claim is held before another attempt may
	// take it over. The handler's context is cancelled a tenth earlier.
	// Defaults to 30s.
	Lease time.Duration

	// Retention is how long a record lives; after it the key is new again.
	// Defaults to 24h.
	Retention time.Duration

	// IsFinalFunc decides which handler statuses are final outcomes that are
	// stored and replayed; it must be true for every 2xx and 3xx (New
	// checks). A 2xx or 3xx is committed with the business transaction (a
	// 303 points at what the handler wrote); a final 4xx (a business
	// rejection such as 422) rolls the transaction back and is stored as
	// FAILED; a non-final status rolls back and releases the key so that a
	// retry executes again. Defaults to DefaultIsFinal.
	IsFinalFunc func(status int) bool

	// ConflictStatus answers a key reused with a different fingerprint: 409
	// (the seed's rule) or 422 (the IETF draft's). Defaults to 409.
	ConflictStatus int

	// ReplayHeaders lists response headers stored and replayed besides
	// Content-Type, Location and ETag. Set-Cookie, Date and authentication
	// headers are refused. Defaults to none.
	ReplayHeaders []string

	// RetryAfter is sent with in-progress answers. Defaults to 1s.
	RetryAfter time.Duration

	// InFlightWait is how long a duplicate that finds its key PROCESSING
	// waits for the original to finish, to replay its answer instead of
	// answering in-progress. Waiters on this instance wake the moment the
	// original finishes; waiters on other instances poll the store, or,
	// when SharedCache's in-flight marker says the key is executing, poll
	// the SharedCache without touching the store. In ModeSinglePhase, a
	// duplicate of a key this instance is executing waits for that
	// execution and replays it, instead of executing beside it and
	// rolling back on the collision. Defaults to 0: answer in-progress at
	// once (claim-first), execute beside it (single-phase).
	InFlightWait time.Duration

	// TxOptions are the options of the transaction the handler runs in
	// (the store starts it with them: a TxOptionsBeginner, as SQLStore
	// is). Defaults to nil: the database's default isolation. Payment
	// events (Orders.ApplyPayment) on MySQL-family servers want
	// sql.LevelReadCommitted: at REPEATABLE READ a locking read of a row
	// that does not exist yet locks the index gap around it, so events of
	// different orders wait for, and deadlock with, each other's
	// uncommitted rows beside theirs (transient and retried, but most
	// events of a busy provider then answer 503 first). The protocol holds
	// at either level; PostgreSQL's default is READ COMMITTED.
	TxOptions *sql.TxOptions

	// InstanceID names this process in lease owners (locked_by). Defaults to
	// hostname-pid.
	InstanceID string

	// SharedCache is an optional pre-filter shared by the fleet (Redis, in
	// package github.com/orderguard/idempotency/redis): it replays committed
	// snapshots that another instance wrote and answers in-progress while
	// another instance executes the key (or waits InFlightWait for its
	// answer), without a database round trip. It never decides whether an
	// attempt executes: the Store does. Defaults to none.
	SharedCache SharedCache

	// Observer receives every outcome; if it also implements StageObserver,
	// every stage. Defaults to none.
	Observer Observer

	// Logger receives one structured line per notable decision (conflict,
	// takeover, release, lease lost, unknown commit outcome, store error),
	// with the key as KeyHash, never raw. Defaults to discarding.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.ReplayCacheBytes == 0 {
		c.ReplayCacheBytes = 8 << 20
	}
	if c.Route == "" && c.Operation != nil {
		c.Route = c.Operation.Name
	}
	if c.Route == "" {
		c.Route = "default"
	}
	if c.HeaderName == "" {
		c.HeaderName = "Idempotency-Key"
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = maxKeyBytes
	}
	if c.ScopeFunc == nil {
		c.ScopeFunc = func(*http.Request) (string, error) { return "", nil }
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MaxSnapshotBytes == 0 {
		c.MaxSnapshotBytes = 1 << 20
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.IsFinalFunc == nil {
		c.IsFinalFunc = DefaultIsFinal
	}
	if c.ConflictStatus == 0 {
		c.ConflictStatus = http.StatusConflict
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Logger == nil {
		c.Logger = discardLogger
	}
	return c
}

// forbiddenReplayHeaders may never be replayed: they belong to one response
// or one principal, not to the stored outcome.
var forbiddenReplayHeaders = map[string]bool{
	"Set-Cookie": true, "Date": true, "Authorization": true, "Www-Authenticate": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Cookie": true,
	"Content-Length": true, "Idempotent-Replayed": true,
}

// DefaultIsFinal is the default Config.IsFinalFunc: every status below 500
// is final except 400, 408, 425 and 429. Those say the request was not
// acted on (it did not parse or validate, or came too early or too often),
// so, as with a 5xx, nothing is stored and a corrected or later retry with
// the same key executes. A body whose number 1.0 does not decode into an
// integer field, for instance, is answered 400 and not replayed to the retry
// that sends 1, although both share a fingerprint (numbers compare by value).
func DefaultIsFinal(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

func (c Config) validate() error {
	switch {
	case c.Operation != nil && (c.FingerprintFunc != nil || len(c.Fingerprint.Fields)+len(c.Fingerprint.IgnoreFields) > 0 || c.Fingerprint.RouteFunc != nil):
		return errors.New("idempotency: Operation declares the fingerprint: leave Fingerprint and FingerprintFunc unset")
	case c.MaxKeyLength < 1 || c.MaxKeyLength > maxKeyBytes:
		return fmt.Errorf("idempotency: MaxKeyLength %d: want 1..%d, the most the schema stores", c.MaxKeyLength, maxKeyBytes)
	case c.MaxBodyBytes < 0:
		return errors.New("idempotency: MaxBodyBytes must not be negative")
	case c.MaxSnapshotBytes < 0 || c.MaxSnapshotBytes > 16<<20:
		return errors.New("idempotency: MaxSnapshotBytes must be 0..16 MiB (the MEDIUMBLOB column)")
	case c.Lease < time.Second:
		return fmt.Errorf("idempotency: Lease %v: want at least 1s", c.Lease)
	case c.Retention < c.Lease:
		return fmt.Errorf("idempotency: Retention %v is shorter than Lease %v", c.Retention, c.Lease)
	case c.ConflictStatus != http.StatusConflict && c.ConflictStatus != http.StatusUnprocessableEntity:
		return fmt.Errorf("idempotency: ConflictStatus %d: want 409 or 422", c.ConflictStatus)
	case c.Mode != ModeClaimFirst && c.Mode != ModeSinglePhase:
		return fmt.Errorf("idempotency: unknown Mode %d", c.Mode)
	case c.RetryAfter < 0 || c.InFlightWait < 0:
		return errors.New("idempotency: RetryAfter and InFlightWait must not be negative")
	case len(c.InstanceID) > 64:
		return errors.New("idempotency: InstanceID longer than 64 bytes")
	}
	for status := 200; status < 400; status++ {
		if !c.IsFinalFunc(status) {
			return fmt.Errorf("idempotency: IsFinalFunc(%d) is false: a 2xx or 3xx is always final (it commits)", status)
		}
	}
	for _, h := range c.ReplayHeaders {
		if forbiddenReplayHeaders[http.CanonicalHeaderKey(h)] {
			return fmt.Errorf("idempotency: ReplayHeaders: %s must never be replayed", h)
		}
	}
	return nil
}

var discardLogger = slog.New(slog.DiscardHandler)
