package client

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"time"
)

// MaxKeyLength is the longest key the server accepts.
const MaxKeyLength = 255

// keyDomain separates KeyFor hashes from any other SHA-256 use of the same ids.
const keyDomain = "orderguard/idempotency-key/v1\x00"

// Key errors. Both are returned before any request is sent.
var (
	// ErrNoKey means the request carries no idempotency key. The transport
	// never makes one up, since a key invented per attempt would let a retry
	// execute the action twice.
	ErrNoKey = errors.New("idempotency client: request has no idempotency key")

	// ErrInvalidKey means the key is not 1–MaxKeyLength visible ASCII
	// characters, which the server would reject with invalid-key.
	ErrInvalidKey = errors.New("idempotency client: invalid idempotency key")
)

// KeyFor returns the deterministic key of the business action identified by
// runID (a run or conversation id) and actionID (a tool-call or intent id).
// The same pair always yields the same key, so a retry, a re-executed tool
// call or a resumed conversation reuses it without storing anything.
//
// The key is always 68 characters of lowercase ASCII, whatever the inputs:
//
//	key = "ik1-" + lowercase_hex(SHA-256(msg))
//	msg = "orderguard/idempotency-key/v1" || 0x00
//	      || uint64_be(len(runID))    || runID
//	      || uint64_be(len(actionID)) || actionID
//
// where runID and actionID are their UTF-8 bytes exactly as given (no Unicode
// normalization) and len is a byte count. The length prefixes keep ("ab", "c")
// and ("a", "bc") apart. In Python:
//
//	def key_for(run_id: str, action_id: str) -> str:
//	    r, a = run_id.encode(), action_id.encode()
//	    msg = (b"orderguard/idempotency-key/v1\x00"
//	           + len(r).to_bytes(8, "big") + r
//	           + len(a).to_bytes(8, "big") + a)
//	    return "ik1-" + hashlib.sha256(msg).hexdigest()
//
// KeyFor("run-1", "call-1") is
// "ik1-1a0ccf1047d9a7f09591dd4bb75334644b989152142461a0a54193bd08caedfc".
func KeyFor(runID, actionID string) string {
	h := sha256.New()
	var n [8]byte
	h.Write([]byte(keyDomain))
	binary.BigEndian.PutUint64(n[:], uint64(len(runID)))
	h.Write(n[:])
	h.Write([]byte(runID))
	binary.BigEndian.PutUint64(n[:], uint64(len(actionID)))
	h.Write(n[:])
	h.Write([]byte(actionID))
	return "ik1-" + hex.EncodeToString(h.Sum(nil))
}

// NewKey returns a new UUIDv7 key (RFC 9562) for a genuinely new user
// intent. Call it once per intent and keep the result for every retry: a new
// key per attempt turns each retry into a new order.
//
// A UUIDv7 begins with the Unix time in milliseconds, then the fraction of
// the millisecond in 12 bits, then 62 random bits, so keys made later sort
// later: a new idempotency record lands at the right edge of the store's
// primary key instead of at a random page of it, which keeps inserts cheap
// when the table is far larger than the database's memory. The 62 random
// bits keep keys from different processes apart. Keys made within the same
// 244 ns step sort in random order among themselves. A key shows when it was
// made; use KeyFor where that must not be seen.
func NewKey() string { return newKeyAt(time.Now()) }

// newKeyAt is NewKey at time t.
func newKeyAt(t time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[8:]) // crypto/rand.Read never fails since Go 1.24
	ms := uint64(t.UnixMilli())
	frac := uint64(t.Nanosecond()%1e6) * 4096 / 1e6 // RFC 9562 §6.2, method 3
	binary.BigEndian.PutUint64(b[0:8], ms<<16|0x7000|frac)
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// CheckKey reports ErrNoKey for an empty key and ErrInvalidKey for one the
// server would refuse, as Client checks before sending: for transports other
// than HTTP (the gRPC client interceptor).
func CheckKey(key string) error { return checkKey(key) }

// checkKey reports ErrNoKey for an empty key and ErrInvalidKey unless key is
// at most MaxKeyLength visible ASCII characters, matching the server's rule
// so a doomed request is not sent at all.
func checkKey(key string) error {
	if key == "" {
		return ErrNoKey
	}
	if len(key) > MaxKeyLength {
		return ErrInvalidKey
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return ErrInvalidKey
		}
	}
	return nil
}
