package faultproxy

import "encoding/binary"

// Codes of the PostgreSQL startup-phase messages that are not a
// StartupMessage (whose code is the protocol version, major 3).
const (
	pgCancelRequest = 80877102
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
)

// pgMaxStartup is the longest startup-phase message PostgreSQL accepts
// (MAX_STARTUP_PACKET_LENGTH); a longer "length" means the bytes are not
// the plain protocol.
const pgMaxStartup = 10000

// pgFramer splits the client→server byte stream into PostgreSQL frontend
// messages. The startup phase's messages have no type byte (int32 length,
// itself included, then an int32 code: SSLRequest, GSSENCRequest,
// CancelRequest or a StartupMessage carrying the protocol version); after
// the StartupMessage every message is a type byte, an int32 length (itself
// included) and the payload. Lengths are big-endian. A simple-query message
// ('Q') small enough to be a COMMIT is held until complete and returned
// separately; everything else passes through as it arrives, so large
// messages are never buffered whole.
//
// When the bytes stop being the plain protocol, the framer passes the rest
// of the connection through unparsed and never returns a COMMIT: after an
// SSLRequest or GSSENCRequest the server accepted (the client goes on with a
// TLS or GSSAPI handshake, whose first bytes make no sane startup message),
// with direct TLS (sslnegotiation=direct), or with anything malformed.
type pgFramer struct {
	pending []byte // bytes of the current message not yet decided on
	stream  int    // bytes of a non-candidate message still to pass through
	typed   bool   // the StartupMessage has passed: messages have a type byte
	opaque  bool   // not the plain protocol: pass everything through
}

func (f *pgFramer) feed(b []byte) (out, commit []byte) {
	f.pending = append(f.pending, b...)
loop:
	for len(f.pending) > 0 {
		switch {
		case f.opaque:
			out = append(out, f.pending...)
			f.pending = f.pending[:0]
		case f.stream > 0:
			n := min(f.stream, len(f.pending))
			out = append(out, f.pending[:n]...)
			f.pending = f.pending[n:]
			f.stream -= n
		case !f.typed:
			if len(f.pending) < 8 {
				break loop
			}
			length := binary.BigEndian.Uint32(f.pending)
			code := binary.BigEndian.Uint32(f.pending[4:])
			if length < 8 || length > pgMaxStartup || !isPostgresStartupCode(code) {
				f.opaque = true
				continue
			}
			// After a StartupMessage the typed messages begin. After the
			// others another startup-phase message follows, if anything: a
			// StartupMessage after a refused SSLRequest ('N'), or the
			// encrypted bytes of an accepted one.
			f.typed = code>>16 == 3
			out = append(out, f.pending[:8]...)
			f.pending = f.pending[8:]
			f.stream = int(length) - 8
		default:
			if len(f.pending) < 5 {
				break loop
			}
			typ := f.pending[0]
			length := binary.BigEndian.Uint32(f.pending[1:])
			if length < 4 {
				f.opaque = true
				continue
			}
			if typ != 'Q' || length-4 > maxCandidate {
				// Not a possible COMMIT: pass the header on and stream the rest.
				out = append(out, f.pending[:5]...)
				f.pending = f.pending[5:]
				f.stream = int(length) - 4
				continue
			}
			size := 1 + int(length)
			if len(f.pending) < size {
				break loop // a candidate: wait for all of it
			}
			msg := f.pending[:size]
			if isPostgresCommit(msg[5:]) {
				commit = append([]byte(nil), msg...)
				f.pending = append([]byte(nil), f.pending[size:]...)
				return out, commit
			}
			out = append(out, msg...)
			f.pending = f.pending[size:]
		}
	}
	f.pending = append([]byte(nil), f.pending...) // do not pin the caller's buffer
	return out, nil
}

// statement returns the text of a COMMIT message: the query string without
// its terminating NUL.
func (f *pgFramer) statement(commit []byte) string { return string(commit[5 : len(commit)-1]) }

// isPostgresStartupCode reports whether code opens a startup-phase message:
// a StartupMessage (protocol version 3.x) or one of the requests.
func isPostgresStartupCode(code uint32) bool {
	switch code {
	case pgCancelRequest, pgSSLRequest, pgGSSENCRequest:
		return true
	}
	return code>>16 == 3
}

// isPostgresCommit reports whether a simple-query payload (a NUL-terminated
// string) is COMMIT.
func isPostgresCommit(payload []byte) bool {
	if len(payload) < len("COMMIT")+1 || payload[len(payload)-1] != 0 {
		return false
	}
	return isCommitText(string(payload[:len(payload)-1]))
}
