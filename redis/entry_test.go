package idemredis

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

func doneRecord(scope, key, fingerprint string) *idempotency.Record {
	return &idempotency.Record{
		Scope: scope, Key: key, Fingerprint: fingerprint, Status: idempotency.StatusDone,
		Snapshot: &idempotency.Snapshot{
			StatusCode: http.StatusCreated,
			Header:     http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/7"}},
			Body:       []byte(`{"order_id":7}`),
		},
	}
}

func TestEntry_Replay_RoundTripsExactlyWhateverTheBytes(t *testing.T) {
	t.Parallel()
	for _, rec := range []*idempotency.Record{
		doneRecord("user-1", "k1", "fp"),
		doneRecord("", "k", "\xff\xfe binary \x00 fingerprint"),
		{Scope: "s", Key: "k", Fingerprint: "f", Status: idempotency.StatusFailed,
			Snapshot: &idempotency.Snapshot{StatusCode: 422, Header: http.Header{}, Body: nil}},
	} {
		got, err := decodeReplay(encodeReplay(rec), rec.Scope, rec.Key)
		require.NoError(t, err)
		require.Equal(t, rec.Fingerprint, got.Fingerprint)
		require.Equal(t, rec.Status, got.Status)
		require.Equal(t, rec.Snapshot.StatusCode, got.Snapshot.StatusCode)
		require.Equal(t, len(rec.Snapshot.Header), len(got.Snapshot.Header))
		for k, v := range rec.Snapshot.Header {
			require.Equal(t, v, got.Snapshot.Header[k])
		}
		require.Equal(t, string(rec.Snapshot.Body), string(got.Snapshot.Body))
	}
}

func TestEntry_Replay_EveryTruncationAndEveryBitFlipIsRefused(t *testing.T) {
	t.Parallel()
	b := encodeReplay(doneRecord("user-1", "k1", "fp"))
	for n := range len(b) {
		_, err := decodeReplay(b[:n], "user-1", "k1")
		require.ErrorIs(t, err, errEntryCorrupt, "truncated to %d bytes", n)
	}
	for i := range len(b) {
		for bit := range 8 {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << bit
			_, err := decodeReplay(c, "user-1", "k1")
			require.ErrorIs(t, err, errEntryCorrupt, "byte %d bit %d flipped", i, bit)
		}
	}
}

func TestEntry_Replay_AnotherScopeKeyKindOrVersionIsRefused(t *testing.T) {
	t.Parallel()
	b := encodeReplay(doneRecord("user-1", "k1", "fp"))
	_, err := decodeReplay(b, "user-2", "k1")
	require.ErrorIs(t, err, errEntryCorrupt, "another scope")
	_, err = decodeReplay(b, "user-1", "k2")
	require.ErrorIs(t, err, errEntryCorrupt, "another key")

	later := append([]byte(nil), b...)
	later[len(replayMagic)] = entryVersion + 1
	_, err = decodeReplay(later, "user-1", "k1")
	require.ErrorIs(t, err, errEntryCorrupt, "a later version")

	marker := encodeMarker(idempotency.InFlightMarker{Scope: "user-1", Key: "k1", Fingerprint: "fp", Owner: "o"})
	_, err = decodeReplay(marker, "user-1", "k1")
	require.ErrorIs(t, err, errEntryCorrupt, "a marker is not a replay")

	processing := doneRecord("user-1", "k1", "fp")
	processing.Status = idempotency.StatusProcessing
	_, err = decodeReplay(encodeReplay(processing), "user-1", "k1")
	require.ErrorIs(t, err, errEntryCorrupt, "only final records replay")

	for _, foreign := range []string{"", "OK", `{"status":"DONE"}`, "\x00\x01\x02\x03\x04\x05\x06\x07\x08"} {
		_, err = decodeReplay([]byte(foreign), "user-1", "k1")
		require.ErrorIs(t, err, errEntryCorrupt, "%q", foreign)
	}
}

func TestEntry_Marker_RoundTripsAndRefusesAnotherScope(t *testing.T) {
	t.Parallel()
	m := idempotency.InFlightMarker{Scope: "user-1", Key: "k1", Fingerprint: "fp", Owner: "host-1/abc"}
	got, err := decodeMarker(encodeMarker(m), "user-1", "k1")
	require.NoError(t, err)
	require.Equal(t, m, *got)
	_, err = decodeMarker(encodeMarker(m), "user-2", "k1")
	require.ErrorIs(t, err, errEntryCorrupt)
	_, err = decodeMarker([]byte("garbage"), "user-1", "k1")
	require.ErrorIs(t, err, errEntryCorrupt)
}

func FuzzDecodeReplay(f *testing.F) {
	f.Add(encodeReplay(doneRecord("s", "k", "f")))
	f.Add([]byte("OGR\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeReplay(b, "s", "k")
		if err == nil {
			require.True(t, rec.Status.Final())
			require.Equal(t, "s", rec.Scope)
			require.Equal(t, "k", rec.Key)
			require.NotNil(t, rec.Snapshot)
		}
	})
}
