package main

// The kinds of new key B4 compares (issue 13, part 5). idembench makes its
// own rather than calling client.NewKey, so that a change of client.NewKey
// does not silently change what "random" means here.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// keyKind is a way of making new keys.
type keyKind struct {
	name string // as the report shows it
	make func() string
}

var (
	// keysRandom are UUIDv4s: 122 random bits, so a new record lands at a
	// random page of the primary key (what client.NewKey made before v7).
	keysRandom = keyKind{"random keys (v4)", newKeyV4}
	// keysTimeOrdered are UUIDv7s: a new record lands next to the last one.
	keysTimeOrdered = keyKind{"time-ordered keys (v7)", newKeyV7}
)

// b4KeyKinds are measured side by side at every B4 level.
var b4KeyKinds = []keyKind{keysRandom, keysTimeOrdered}

// newKeyV4 is an RFC 9562 UUIDv4.
func newKeyV4() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

// newKeyV7 is an RFC 9562 UUIDv7 made now.
func newKeyV7() string { return newKeyV7At(time.Now()) }

// newKeyV7At is an RFC 9562 UUIDv7 for time t: 48 bits of Unix milliseconds,
// the version, 12 bits of the millisecond's fraction (§6.2, method 3, so
// keys made later in one process sort later), the variant and 62 random
// bits.
func newKeyV7At(t time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[8:])
	frac := uint64(t.Nanosecond()%1e6) * 4096 / 1e6
	binary.BigEndian.PutUint64(b[0:8], uint64(t.UnixMilli())<<16|0x7000|frac)
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

// formatUUID is the 36-character lowercase form.
func formatUUID(b [16]byte) string {
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

// genKeysOf is genNewKey with keys of kind k.
func genKeysOf(k keyKind) generator {
	return func(w *worker) request {
		r := genBaseline(w)
		r.key = k.make()
		return r
	}
}

// keyKindRatios compares B4's new keys of both kinds at each level, each
// point through its own B0 (they were measured one after the other): the
// time-ordered keys' B1/B0 over the random keys'.
func keyKindRatios(points []*Point) []Ratio {
	var out []Ratio
	var top int64
	for _, p := range points {
		if p.Bench == "B4:B1" {
			top = max(top, p.Records)
		}
	}
	for _, v7 := range points {
		mode, ok := strings.CutSuffix(v7.Variant, ", "+keysTimeOrdered.name)
		if v7.Bench != "B4:B1" || !ok || v7.BaselineRPS == 0 {
			continue
		}
		i := slices.IndexFunc(points, func(p *Point) bool {
			return p.Bench == "B4:B1" && p.Records == v7.Records && p.Variant == mode+", "+keysRandom.name && p.BaselineRPS > 0
		})
		if i < 0 {
			continue
		}
		v4 := points[i]
		name := fmt.Sprintf("B4 B1 %s, v7/v4 keys %%s at %s records (each over its own B0)", mode, humanCount(v7.Records))
		reads := fmt.Sprintf("; disk reads/req %.2f vs %.2f", v7.Server["bp_disk_reads"], v4.Server["bp_disk_reads"])
		out = append(out, overOwnB0(fmt.Sprintf(name, "throughput"), fmt.Sprintf(name, "P99"), v7, v4, reads, v7.Records == top)...)
	}
	return out
}
