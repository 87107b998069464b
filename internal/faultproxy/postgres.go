package faultproxy

import (
	"bytes"
	"encoding/binary"
)

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

// pgNameLen is how much of a prepared statement's name PostgreSQL goes by:
// NAMEDATALEN-1 = 63 bytes in a default build. It keys its statements by
// the name truncated to that length, so names that differ only beyond it
// name the same statement.
const pgNameLen = 63

// pgMaxExtended is the largest payload of an extended-protocol message that
// is inspected whole as part of a possible COMMIT: room for a statement and
// a portal name (pgx's are 58 bytes and empty) beside maxCandidate for the
// rest. Of a longer Parse or Close only the first pgMaxExtended bytes, which
// hold the statement's name, are inspected; the rest is streamed.
const pgMaxExtended = maxCandidate + 2*(pgNameLen+1)

// pgMaxCommitGroup bounds the bytes held for an extended-protocol COMMIT
// before its Sync: its Bind (at most 5+pgMaxExtended bytes) and a Describe,
// an Execute and a Flush with a portal name of pgNameLen take 345 bytes.
const pgMaxCommitGroup = 512

// Types of the frontend messages the framer looks into.
const (
	pgTypeQuery    = 'Q' // simple query: the query string
	pgTypeParse    = 'P' // statement name, query string, parameter types
	pgTypeBind     = 'B' // portal name, statement name, formats, parameters
	pgTypeDescribe = 'D' // 'S' or 'P', then a statement or portal name
	pgTypeExecute  = 'E' // portal name, row limit
	pgTypeFlush    = 'H'
	pgTypeSync     = 'S'
	pgTypeClose    = 'C' // 'S' or 'P', then a statement or portal name
)

// pgFramer splits the client→server byte stream into PostgreSQL frontend
// messages. The startup phase's messages have no type byte (int32 length,
// itself included, then an int32 code: SSLRequest, GSSENCRequest,
// CancelRequest or a StartupMessage carrying the protocol version); after
// the StartupMessage every message is a type byte, an int32 length (itself
// included) and the payload. Lengths are big-endian, strings NUL-terminated.
//
// A COMMIT comes in one of two forms, each held until complete and returned
// separately:
//
//   - a simple-query message ('Q') whose text is COMMIT;
//   - by the extended protocol, a Bind ('B') of a prepared statement whose
//     query is COMMIT, with everything after it up to and including the next
//     Sync ('S'): the Describe ('D'), Execute ('E') and Flush ('H') messages
//     between them. The server commits at the Execute; the COMMIT runs on
//     to the Sync because that is where a client stops to wait for the
//     answers, and a pipeline such as pgx's SendBatch puts it after its last
//     statement. (A client that waited after a Flush, before the Sync,
//     would wait on the proxy; pgx does not.) Messages before the Bind, such
//     as an INSERT's Bind and Execute in the same pipeline, are forwarded as
//     usual. When another kind of message, or more than pgMaxCommitGroup
//     bytes, come before the Sync, the Bind and what followed are forwarded
//     after all and are no COMMIT.
//
// To know which statements are COMMIT the framer follows, per connection,
// the Parse ('P') messages that name a statement (the unnamed statement ""
// too) and the Close ('C') messages that close one: a Parse whose query is
// COMMIT makes its name a COMMIT statement, a Parse of other text and a
// Close forget it, and so does a simple query for the unnamed statement,
// which it destroys. It does not read the server's answers, so it takes
// every Parse and Close to succeed, and it does not see statements
// deallocated by SQL (DEALLOCATE, DISCARD): a Bind of such a name, which
// the server would refuse, is taken for a COMMIT.
//
// Everything else passes through as it arrives, so large messages are never
// buffered whole: of a Parse or Close only enough to read the name is held.
//
// When the bytes stop being the plain protocol, the framer passes the rest
// of the connection through unparsed and never returns a COMMIT: after an
// SSLRequest or GSSENCRequest the server accepted (the client goes on with a
// TLS or GSSAPI handshake, whose first bytes make no sane startup message),
// with direct TLS (sslnegotiation=direct), or with anything malformed.
type pgFramer struct {
	pending []byte // bytes not yet decided on: the current message's, after any held group
	stream  int    // bytes of a non-candidate message still to pass through
	typed   bool   // the StartupMessage has passed: messages have a type byte
	opaque  bool   // not the plain protocol: pass everything through

	// group is how many bytes at the start of pending are a COMMIT's Bind
	// and the messages after it, held until the Sync; 0 when none is.
	group int

	// commits maps the name of every prepared statement whose query is
	// COMMIT, as pgStatementName keys it, to that query.
	commits map[string]string
}

func (f *pgFramer) feed(b []byte) (out, commit []byte) {
	f.pending = append(f.pending, b...)
	for len(f.pending) > 0 && commit == nil {
		wait := false
		switch {
		case f.opaque:
			out = f.forward(out, len(f.pending))
		case f.stream > 0:
			n := min(f.stream, len(f.pending))
			out = f.forward(out, n)
			f.stream -= n
		case !f.typed:
			out, wait = f.startupMessage(out)
		case f.group > 0:
			out, commit, wait = f.commitGroup(out)
		default:
			out, commit, wait = f.typedMessage(out)
		}
		if wait {
			break
		}
	}
	f.pending = append([]byte(nil), f.pending...) // do not pin the caller's buffer
	return out, commit
}

// forward appends the first n pending bytes to out and consumes them.
func (f *pgFramer) forward(out []byte, n int) []byte {
	out = append(out, f.pending[:n]...)
	f.pending = f.pending[n:]
	return out
}

// take consumes the first n pending bytes and returns a copy of them.
func (f *pgFramer) take(n int) []byte {
	msg := append([]byte(nil), f.pending[:n]...)
	f.pending = f.pending[n:]
	return msg
}

// startupMessage frames a startup-phase message: it forwards its length and
// code and streams the rest. It reports wait when the 8 bytes are not all
// there yet.
func (f *pgFramer) startupMessage(out []byte) (_ []byte, wait bool) {
	if len(f.pending) < 8 {
		return out, true
	}
	length := binary.BigEndian.Uint32(f.pending)
	code := binary.BigEndian.Uint32(f.pending[4:])
	if length < 8 || length > pgMaxStartup || !isPostgresStartupCode(code) {
		f.opaque = true
		return out, false
	}
	// After a StartupMessage the typed messages begin. After the others
	// another startup-phase message follows, if anything: a StartupMessage
	// after a refused SSLRequest ('N'), or the encrypted bytes of an
	// accepted one.
	f.typed = code>>16 == 3
	f.stream = int(length) - 8
	return f.forward(out, 8), false
}

// typedMessage frames a typed message. It waits for its header and the part
// of its payload pgInspected names, and decides on them: a simple-query
// COMMIT is returned as commit; a Bind of a COMMIT statement starts a group;
// a Parse or Close updates the COMMIT statements. Anything else is
// forwarded, the rest of the payload streamed.
func (f *pgFramer) typedMessage(out []byte) (_, commit []byte, wait bool) {
	if len(f.pending) < 5 {
		return out, nil, true
	}
	typ := f.pending[0]
	length := binary.BigEndian.Uint32(f.pending[1:])
	if length < 4 {
		f.opaque = true
		return out, nil, false
	}
	size := 1 + int(length)
	inspected := pgInspected(typ, size-5)
	if len(f.pending) < 5+inspected {
		return out, nil, true // a candidate: wait for all of it
	}
	payload, whole := f.pending[5:5+inspected], 5+inspected == size
	switch typ {
	case pgTypeQuery:
		delete(f.commits, "") // a simple query destroys the unnamed statement
		if whole && isPostgresCommit(payload) {
			return out, f.take(size), false
		}
	case pgTypeParse:
		f.parsed(payload, whole)
	case pgTypeClose:
		f.closed(payload)
	case pgTypeBind:
		if whole && f.bindsCommit(payload) {
			f.group = size
			return out, nil, false
		}
	}
	f.stream = size - 5 - inspected
	return f.forward(out, 5+inspected), nil, false
}

// pgInspected returns how many of the payload bytes of a message of type
// typ are held and inspected before it is forwarded: all of a simple query or
// Bind small enough to be a COMMIT, and of a Parse or Close enough to hold
// the name (and the COMMIT's text, if it is small enough to be one).
func pgInspected(typ byte, payload int) int {
	switch typ {
	case pgTypeQuery:
		if payload <= maxCandidate {
			return payload
		}
	case pgTypeBind:
		if payload <= pgMaxExtended {
			return payload
		}
	case pgTypeParse, pgTypeClose:
		return min(payload, pgMaxExtended)
	}
	return 0
}

// commitGroup takes the message after the held COMMIT Bind and what followed
// it. A Sync completes the COMMIT, returned as commit; a Describe, Execute or
// Flush joins the group, once it is all there. Anything else, a malformed
// message or one that would make the group larger than pgMaxCommitGroup
// ends it: the group is forwarded, not a COMMIT after all, and that message
// is framed anew.
func (f *pgFramer) commitGroup(out []byte) (_, commit []byte, wait bool) {
	next := f.pending[f.group:]
	if len(next) < 5 {
		return out, nil, true
	}
	typ := next[0]
	length := binary.BigEndian.Uint32(next[1:])
	size := 1 + int(length)
	switch {
	case typ == pgTypeSync && length == 4:
		commit = f.take(f.group + size)
		f.group = 0
		return out, commit, false
	case isPostgresCommitGroupType(typ) && length >= 4 && f.group+size <= pgMaxCommitGroup:
		if len(next) < size {
			return out, nil, true
		}
		f.group += size
		return out, nil, false
	}
	out = f.forward(out, f.group)
	f.group = 0
	return out, nil, false
}

// isPostgresCommitGroupType reports whether a message of type typ may come
// between a COMMIT's Bind and its Sync.
func isPostgresCommitGroupType(typ byte) bool {
	return typ == pgTypeDescribe || typ == pgTypeExecute || typ == pgTypeFlush
}

// parsed notes a Parse message, of which payload holds the start or, when
// whole, all: its statement becomes a COMMIT statement if its query is
// COMMIT, and is forgotten otherwise. A Parse replaces the unnamed
// statement; a named one must have been closed before it is parsed anew.
func (f *pgFramer) parsed(payload []byte, whole bool) {
	name := pgStatementName(payload)
	if whole {
		if _, rest, ok := bytes.Cut(payload, []byte{0}); ok {
			if query, _, ok := bytes.Cut(rest, []byte{0}); ok && isCommitText(string(query)) {
				if f.commits == nil {
					f.commits = map[string]string{}
				}
				f.commits[name] = string(query)
				return
			}
		}
	}
	delete(f.commits, name)
}

// closed notes a Close message, of which payload holds the start: closing a
// statement ('S', rather than a portal, 'P') forgets it.
func (f *pgFramer) closed(payload []byte) {
	if len(payload) > 0 && payload[0] == 'S' {
		delete(f.commits, pgStatementName(payload[1:]))
	}
}

// bindsCommit reports whether a Bind message's payload binds a COMMIT
// statement: its portal name is followed by the statement's.
func (f *pgFramer) bindsCommit(payload []byte) bool {
	_, rest, ok := bytes.Cut(payload, []byte{0})
	if !ok {
		return false
	}
	_, found := f.commits[pgStatementName(rest)]
	return found
}

// statement returns the text of a COMMIT message: for a simple query the
// query string without its terminating NUL, for a Bind the query of the
// statement it binds.
func (f *pgFramer) statement(commit []byte) string {
	if commit[0] == pgTypeBind {
		_, rest, _ := bytes.Cut(commit[5:], []byte{0})
		return f.commits[pgStatementName(rest)]
	}
	return string(commit[5 : len(commit)-1])
}

// pgStatementName returns the statement name b starts with (NUL-terminated,
// or cut short with b) as PostgreSQL keys it: its first pgNameLen bytes.
func pgStatementName(b []byte) string {
	name, _, _ := bytes.Cut(b, []byte{0})
	return string(name[:min(len(name), pgNameLen)])
}

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
