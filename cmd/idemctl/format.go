package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/orderguard/idempotency"
)

// statuses lists every state, so that stats prints zeros too.
var statuses = []idempotency.Status{idempotency.StatusProcessing, idempotency.StatusDone, idempotency.StatusFailed}

// statsJSON is stats --json.
type statsJSON struct {
	ByStatus                map[idempotency.Status]int64 `json:"by_status"`
	Total                   int64                        `json:"total"`
	OldestProcessingSeconds float64                      `json:"oldest_processing_seconds"` // 0 when none
	OldestProcessing        string                       `json:"oldest_processing"`         // "none" when none
	ExpiredLeases           int64                        `json:"expired_leases"`
	AwaitingPurge           int64                        `json:"awaiting_purge"`
	TableBytes              *int64                       `json:"table_bytes"` // null when the database cannot tell
	TableSize               string                       `json:"table_size"`  // "unknown" when the database cannot tell
}

func statsJSONOf(st *idempotency.Stats) statsJSON {
	out := statsJSON{
		ByStatus:                map[idempotency.Status]int64{},
		OldestProcessingSeconds: st.OldestProcessing.Seconds(),
		OldestProcessing:        "none",
		ExpiredLeases:           st.ExpiredLeases,
		AwaitingPurge:           st.AwaitingPurge,
		TableSize:               humanBytes(st.TableBytes),
	}
	for _, s := range statuses {
		out.ByStatus[s] = 0
	}
	for s, n := range st.ByStatus {
		out.ByStatus[s] = n
		out.Total += n
	}
	if st.ByStatus[idempotency.StatusProcessing] > 0 {
		out.OldestProcessing = fmtDuration(st.OldestProcessing)
	}
	if st.TableBytes >= 0 {
		out.TableBytes = &st.TableBytes
	}
	return out
}

func writeStats(w io.Writer, st *idempotency.Stats, dialect string) {
	j := statsJSONOf(st)
	fmt.Fprintln(w, "records by status:")
	names := make([]string, 0, len(j.ByStatus))
	for s := range j.ByStatus {
		names = append(names, string(s))
	}
	sort.Slice(names, func(a, b int) bool { return statusRank(names[a]) < statusRank(names[b]) })
	for _, s := range names {
		fmt.Fprintf(w, "  %-12s %d\n", s, j.ByStatus[idempotency.Status(s)])
	}
	fmt.Fprintf(w, "  %-12s %d\n", "total", j.Total)
	fmt.Fprintf(w, "oldest PROCESSING:  %s\n", j.OldestProcessing)
	fmt.Fprintf(w, "expired leases:     %d  (PROCESSING records whose attempt is presumed dead; the reconciler settles them)\n", j.ExpiredLeases)
	fmt.Fprintf(w, "awaiting purge:     %d  (final records past retention)\n", j.AwaitingPurge)
	size := j.TableSize
	if dialect == "sqlite" && st.TableBytes >= 0 {
		size += "  (the whole SQLite file)"
	}
	fmt.Fprintf(w, "table size:         %s\n", size)
}

// statusRank orders the known states first, in their life order, then any
// other (unknown) state by name.
func statusRank(s string) string {
	for i, known := range statuses {
		if string(known) == s {
			return fmt.Sprint(i)
		}
	}
	return "9" + s
}

// recordJSON is inspect --json.
type recordJSON struct {
	Scope        string        `json:"scope"`
	Key          string        `json:"key"`
	KeyHash      string        `json:"key_hash"` // as in the middleware's logs and traces
	State        string        `json:"state"`
	Owner        string        `json:"owner"`
	LeaseVersion int64         `json:"lease_version"`
	LockedUntil  *time.Time    `json:"locked_until"`  // null once final
	LeaseExpired *bool         `json:"lease_expired"` // null once final
	CreatedAt    time.Time     `json:"created_at"`
	UpdatedAt    time.Time     `json:"updated_at"`
	ExpiresAt    time.Time     `json:"expires_at"`
	Expired      bool          `json:"expired"`
	ReadAt       time.Time     `json:"read_at"` // the database's clock at the read
	Fingerprint  string        `json:"fingerprint"`
	Response     *responseJSON `json:"response"` // null while PROCESSING
}

type responseJSON struct {
	StatusCode int         `json:"status_code"`
	Headers    http.Header `json:"headers"`
	BodyBytes  int         `json:"body_bytes"`
	Body       *string     `json:"body,omitempty"`        // with --body, when the body is UTF-8
	BodyBase64 *string     `json:"body_base64,omitempty"` // with --body, when it is not
}

func recordJSONOf(rec *idempotency.Record, withBody bool) recordJSON {
	out := recordJSON{
		Scope: rec.Scope, Key: rec.Key, KeyHash: idempotency.KeyHash(rec.Scope, rec.Key),
		State: string(rec.Status), Owner: rec.Owner, LeaseVersion: rec.Version,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt, ExpiresAt: rec.ExpiresAt,
		Expired: rec.Expired, ReadAt: rec.ReadAt, Fingerprint: rec.Fingerprint,
	}
	if rec.Status == idempotency.StatusProcessing {
		until, expired := rec.LockedUntil, rec.LeaseExpired
		out.LockedUntil, out.LeaseExpired = &until, &expired
	}
	if snap := rec.Snapshot; snap != nil {
		r := &responseJSON{StatusCode: snap.StatusCode, Headers: snap.Header, BodyBytes: len(snap.Body)}
		if r.Headers == nil {
			r.Headers = http.Header{}
		}
		if withBody {
			if utf8.Valid(snap.Body) {
				s := string(snap.Body)
				r.Body = &s
			} else {
				s := base64.StdEncoding.EncodeToString(snap.Body)
				r.BodyBase64 = &s
			}
		}
		out.Response = r
	}
	return out
}

func writeRecord(w io.Writer, rec *idempotency.Record, withBody bool) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "%-15s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("scope", "%q", rec.Scope)
	line("key", "%q", rec.Key)
	line("key hash", "%s (as in the middleware's logs)", idempotency.KeyHash(rec.Scope, rec.Key))
	line("state", "%s", rec.Status)
	line("note", "%s", recordNote(rec))
	line("owner", "%s", rec.Owner)
	line("lease version", "%d", rec.Version)
	switch {
	case rec.Status != idempotency.StatusProcessing:
		line("locked until", "- (final: no lease)")
	case rec.LeaseExpired:
		line("locked until", "%s (%s: lease EXPIRED)", fmtTime(rec.LockedUntil), relative(rec.LockedUntil, rec.ReadAt))
	default:
		line("locked until", "%s (%s: lease held)", fmtTime(rec.LockedUntil), relative(rec.LockedUntil, rec.ReadAt))
	}
	line("created", "%s (%s)", fmtTime(rec.CreatedAt), relative(rec.CreatedAt, rec.ReadAt))
	line("updated", "%s (%s)", fmtTime(rec.UpdatedAt), relative(rec.UpdatedAt, rec.ReadAt))
	if rec.Expired {
		line("expires", "%s (%s: EXPIRED, retention passed)", fmtTime(rec.ExpiresAt), relative(rec.ExpiresAt, rec.ReadAt))
	} else {
		line("expires", "%s (%s: retention running)", fmtTime(rec.ExpiresAt), relative(rec.ExpiresAt, rec.ReadAt))
	}
	line("fingerprint", "%s", rec.Fingerprint)
	snap := rec.Snapshot
	if snap == nil {
		line("response", "none yet")
		return
	}
	line("response", "%d %s", snap.StatusCode, http.StatusText(snap.StatusCode))
	names := make([]string, 0, len(snap.Header))
	for name := range snap.Header {
		names = append(names, name)
	}
	sort.Strings(names)
	label := "headers:"
	if len(names) == 0 {
		fmt.Fprintf(w, "%-15s none\n", label)
	}
	for _, name := range names {
		for _, v := range snap.Header[name] {
			fmt.Fprintf(w, "%-15s %s: %s\n", label, name, v)
			label = ""
		}
	}
	if !withBody {
		line("body", "%d bytes (--body prints it)", len(snap.Body))
		return
	}
	line("body", "%d bytes:", len(snap.Body))
	w.Write(snap.Body) //nolint:errcheck // as fmt.Fprint's results above
	if len(snap.Body) > 0 && snap.Body[len(snap.Body)-1] != '\n' {
		fmt.Fprintln(w)
	}
}

// recordNote says in one line what the record means for a retry.
func recordNote(rec *idempotency.Record) string {
	switch {
	case rec.Expired:
		return "retention passed: the key is new again, and purge deletes this record"
	case rec.Status == idempotency.StatusProcessing && rec.LeaseExpired:
		return "lease expired: the attempt is presumed dead; a retry of the same request takes the key over, or the reconciler settles it"
	case rec.Status == idempotency.StatusProcessing:
		return "an attempt holds the key; duplicates are told it is in progress until it finishes or its lease expires"
	default:
		return "retries of the same request replay the stored response"
	}
}

// fmtTime prints a database time. MySQL DATETIME carries no zone, so a MySQL
// time is the server's wall clock, printed as if UTC.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}

// relative says how far t is from now: "in 5m0s" or "3.5s ago".
func relative(t, now time.Time) string {
	if d := t.Sub(now); d > 0 {
		return "in " + fmtDuration(d)
	}
	return fmtDuration(now.Sub(t)) + " ago"
}

// fmtDuration rounds d for people: milliseconds below a minute, seconds above.
func fmtDuration(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// humanBytes prints n in IEC units, or "unknown" for a negative n.
func humanBytes(n int64) string {
	if n < 0 {
		return "unknown"
	}
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v := float64(n) / 1024
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s (%d bytes)", v, units[i], n)
}
