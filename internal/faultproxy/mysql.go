package faultproxy

import "strings"

// comQuery is the MySQL COM_QUERY command byte.
const comQuery = 0x03

// mysqlFramer splits the client→server byte stream into MySQL packets (3-byte
// little-endian payload length, 1-byte sequence id, payload). Packets that
// could be a COMMIT are held until complete and returned separately;
// everything else passes through as it arrives, so large packets are never
// buffered whole.
type mysqlFramer struct {
	pending []byte // bytes of the current packet not yet decided on
	stream  int    // payload bytes of a non-candidate packet still to pass through
}

func (f *mysqlFramer) feed(b []byte) (out, commit []byte) {
	f.pending = append(f.pending, b...)
	for len(f.pending) > 0 {
		if f.stream > 0 {
			n := min(f.stream, len(f.pending))
			out = append(out, f.pending[:n]...)
			f.pending = f.pending[n:]
			f.stream -= n
			continue
		}
		if len(f.pending) < 4 {
			break
		}
		length := int(f.pending[0]) | int(f.pending[1])<<8 | int(f.pending[2])<<16
		seq := f.pending[3]
		if seq != 0 || length > maxCandidate {
			// Not a possible COMMIT: pass the header on and stream the payload.
			out = append(out, f.pending[:4]...)
			f.pending = f.pending[4:]
			f.stream = length
			continue
		}
		if len(f.pending) < 4+length {
			break // a candidate: wait for all of it
		}
		pkt := f.pending[:4+length]
		if isMySQLCommit(pkt[4:]) {
			commit = append([]byte(nil), pkt...)
			f.pending = append([]byte(nil), f.pending[4+length:]...)
			return out, commit
		}
		out = append(out, pkt...)
		f.pending = f.pending[4+length:]
	}
	f.pending = append([]byte(nil), f.pending...) // do not pin the caller's buffer
	return out, nil
}

// statement returns the text of a COMMIT packet: the payload after the
// command byte.
func (f *mysqlFramer) statement(commit []byte) string { return string(commit[5:]) }

// isMySQLCommit reports whether a command payload is COM_QUERY "COMMIT".
func isMySQLCommit(payload []byte) bool {
	if len(payload) < 1+len("COMMIT") || payload[0] != comQuery {
		return false
	}
	return isCommitText(string(payload[1:]))
}

// isCommitText reports whether a statement is COMMIT, case-insensitively,
// with optional surrounding whitespace and a trailing semicolon.
func isCommitText(q string) bool {
	q = strings.TrimSpace(q)
	q = strings.TrimSpace(strings.TrimSuffix(q, ";"))
	return strings.EqualFold(q, "COMMIT")
}
