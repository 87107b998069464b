package idemredis

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net/http"
	"slices"

	"github.com/orderguard/idempotency"
)

// An entry is a tagged, length-prefixed binary encoding with a checksum:
//
//	magic (3 bytes) | version (1 byte) | fields (uvarint length + bytes each) | CRC-32C of all before it (4 bytes)
//
// Binary rather than JSON so that fingerprints and keys, which may be any
// bytes, survive exactly: a decoder that replaced invalid UTF-8 could make
// two different fingerprints equal. Anything that does not decode exactly
// (another program's value, a truncated or bit-flipped one, a later version)
// is a miss.
const (
	replayMagic  = "OGR"
	markerMagic  = "OGM"
	entryVersion = 1
)

var (
	errEntryCorrupt = errors.New("idemredis: corrupt or foreign entry")
	castagnoli      = crc32.MakeTable(crc32.Castagnoli)
)

// entryWriter builds one entry.
type entryWriter struct{ b []byte }

func newEntry(magic string) *entryWriter {
	return &entryWriter{b: append([]byte(magic), entryVersion)}
}

func (w *entryWriter) bytes(p []byte) {
	w.b = binary.AppendUvarint(w.b, uint64(len(p)))
	w.b = append(w.b, p...)
}
func (w *entryWriter) string(s string) {
	w.b = binary.AppendUvarint(w.b, uint64(len(s)))
	w.b = append(w.b, s...)
}
func (w *entryWriter) uint(n uint64) { w.b = binary.AppendUvarint(w.b, n) }

func (w *entryWriter) seal() []byte {
	return binary.BigEndian.AppendUint32(w.b, crc32.Checksum(w.b, castagnoli))
}

// entryReader reads one entry; the first failure sticks.
type entryReader struct {
	b   []byte
	err error
}

func openEntry(magic string, b []byte) *entryReader {
	n := len(magic) + 1
	if len(b) < n+4 || string(b[:len(magic)]) != magic || b[len(magic)] != entryVersion {
		return &entryReader{err: errEntryCorrupt}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return &entryReader{err: errEntryCorrupt}
	}
	return &entryReader{b: body[n:]}
}

func (r *entryReader) uint(limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	n, size := binary.Uvarint(r.b)
	if size <= 0 || n > limit {
		r.err = errEntryCorrupt
		return 0
	}
	r.b = r.b[size:]
	return n
}

func (r *entryReader) bytes() []byte {
	n := r.uint(uint64(len(r.b)))
	if r.err != nil {
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *entryReader) string() string { return string(r.bytes()) }

// close reports whether the whole entry was read without error.
func (r *entryReader) close() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = errEntryCorrupt
	}
	return r.err
}

// encodeReplay encodes a final record's replay: scope, key, fingerprint,
// status and snapshot.
func encodeReplay(rec *idempotency.Record) []byte {
	w := newEntry(replayMagic)
	w.string(rec.Scope)
	w.string(rec.Key)
	w.string(rec.Fingerprint)
	w.string(string(rec.Status))
	w.uint(uint64(rec.Snapshot.StatusCode))
	names := make([]string, 0, len(rec.Snapshot.Header))
	for name := range rec.Snapshot.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	w.uint(uint64(len(names)))
	for _, name := range names {
		w.string(name)
		values := rec.Snapshot.Header[name]
		w.uint(uint64(len(values)))
		for _, v := range values {
			w.string(v)
		}
	}
	w.bytes(rec.Snapshot.Body)
	return w.seal()
}

// decodeReplay decodes an entry written by encodeReplay. It checks that the
// entry is whole, final and for scope and key.
func decodeReplay(b []byte, scope, key string) (*idempotency.Record, error) {
	r := openEntry(replayMagic, b)
	rec := &idempotency.Record{Scope: r.string(), Key: r.string(), Fingerprint: r.string(), Status: idempotency.Status(r.string())}
	snap := &idempotency.Snapshot{StatusCode: int(r.uint(999)), Header: http.Header{}}
	for n := r.uint(uint64(len(b))); n > 0 && r.err == nil; n-- {
		name := r.string()
		for m := r.uint(uint64(len(b))); m > 0 && r.err == nil; m-- {
			snap.Header[name] = append(snap.Header[name], r.string())
		}
	}
	snap.Body = r.bytes()
	if err := r.close(); err != nil {
		return nil, err
	}
	if rec.Scope != scope || rec.Key != key || rec.Fingerprint == "" || !rec.Status.Final() || snap.StatusCode < 100 {
		return nil, errEntryCorrupt
	}
	rec.Snapshot = snap
	return rec, nil
}

// encodeMarker encodes an in-flight marker.
func encodeMarker(m idempotency.InFlightMarker) []byte {
	w := newEntry(markerMagic)
	w.string(m.Scope)
	w.string(m.Key)
	w.string(m.Fingerprint)
	w.string(m.Owner)
	return w.seal()
}

// decodeMarker decodes an entry written by encodeMarker, for scope and key.
func decodeMarker(b []byte, scope, key string) (*idempotency.InFlightMarker, error) {
	r := openEntry(markerMagic, b)
	m := &idempotency.InFlightMarker{Scope: r.string(), Key: r.string(), Fingerprint: r.string(), Owner: r.string()}
	if err := r.close(); err != nil {
		return nil, err
	}
	if m.Scope != scope || m.Key != key || m.Fingerprint == "" || m.Owner == "" {
		return nil, errEntryCorrupt
	}
	return m, nil
}
