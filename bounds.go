package idempotency

import "fmt"

// The record table's bounds, in bytes: the same on every dialect. Which
// bytes a value may hold is the dialect's (TextChecker).
const (
	maxScopeBytes       = 255
	maxKeyBytes         = 255
	maxFingerprintBytes = 128
	maxOwnerBytes       = 128
)

// fits reports ErrClaimOutOfBounds for a claim the record table cannot
// hold: a value over its byte bound, or one that checkText (the dialect's
// TextChecker, if any) refuses. The schema is not asked: MySQL in strict
// mode refuses a value too long, but SQLite stores it and PostgreSQL's
// table has no CHECKs (migration 004).
func (c Claim) fits(checkText func(string) error) error {
	switch {
	case c.Key == "" || len(c.Key) > maxKeyBytes:
		return fmt.Errorf("%w: key of %d bytes, want 1..%d", ErrClaimOutOfBounds, len(c.Key), maxKeyBytes)
	case len(c.Scope) > maxScopeBytes:
		return fmt.Errorf("%w: scope of %d bytes, want at most %d", ErrClaimOutOfBounds, len(c.Scope), maxScopeBytes)
	case len(c.Fingerprint) > maxFingerprintBytes:
		return fmt.Errorf("%w: fingerprint of %d bytes, want at most %d", ErrClaimOutOfBounds, len(c.Fingerprint), maxFingerprintBytes)
	case len(c.Owner) > maxOwnerBytes:
		return fmt.Errorf("%w: owner of %d bytes, want at most %d", ErrClaimOutOfBounds, len(c.Owner), maxOwnerBytes)
	case checkText == nil:
		return nil
	}
	for _, v := range []struct{ name, value string }{
		{"scope", c.Scope}, {"key", c.Key}, {"fingerprint", c.Fingerprint}, {"owner", c.Owner},
	} {
		if err := checkText(v.value); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrClaimOutOfBounds, v.name, err)
		}
	}
	return nil
}

// TextChecker is implemented by a Store whose record table cannot hold
// every string in its scope, key, fingerprint and owner columns. SQLStore
// implements it for its Dialect: PostgreSQL's text columns hold UTF-8
// without NUL, where MySQL's VARBINARY and SQLite's TEXT hold any bytes.
//
// The middleware consults it before anything executes, in both modes: a
// scope the store cannot hold is answered 401 scope-required, without a
// Retry-After (a retry would meet the same refusal), and writes nothing; a
// fingerprint it cannot hold (a FingerprintFunc's) is answered 500; and New
// refuses an InstanceID it cannot hold. Keys need no check: they are
// visible ASCII, which every store holds. The store still refuses such a
// value itself (ErrClaimOutOfBounds), before any statement.
type TextChecker interface {
	// CheckText returns nil if the record table holds s byte for byte,
	// else an error saying why it cannot.
	CheckText(s string) error
}

// checkText is store's TextChecker, or nil.
func checkText(store Store) func(string) error {
	if tc, ok := store.(TextChecker); ok {
		return tc.CheckText
	}
	return nil
}

// scopeFits reports why the store cannot hold scope, if it cannot.
func (m *Middleware) scopeFits(scope string) error {
	if len(scope) > maxScopeBytes {
		return fmt.Errorf("scope longer than %d bytes", maxScopeBytes)
	}
	if check := checkText(m.store); check != nil {
		if err := check(scope); err != nil {
			return fmt.Errorf("the idempotency store cannot hold this scope: %w", err)
		}
	}
	return nil
}

// fingerprintFits reports why the store cannot hold fp, if it cannot.
func (m *Middleware) fingerprintFits(fp string) error {
	if len(fp) == 0 || len(fp) > maxFingerprintBytes {
		return fmt.Errorf("idempotency: fingerprint must be 1..%d bytes, got %d", maxFingerprintBytes, len(fp))
	}
	if check := checkText(m.store); check != nil {
		if err := check(fp); err != nil {
			return fmt.Errorf("idempotency: the store cannot hold the fingerprint: %w", err)
		}
	}
	return nil
}

// ownerFits reports an InstanceID whose lease owners (InstanceID/token)
// the store cannot hold.
func ownerFits(store Store, instanceID string) error {
	if check := checkText(store); check != nil {
		if err := check(instanceID); err != nil {
			return fmt.Errorf("idempotency: InstanceID %q: the store cannot hold it: %w", instanceID, err)
		}
	}
	return nil
}
