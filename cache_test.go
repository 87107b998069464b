package idempotency

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is an injected clock for the replay cache.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func finalRecord(key string, bodySize int) *Record {
	return &Record{Scope: "s", Key: key, Fingerprint: "fp", Status: StatusDone,
		Snapshot: &Snapshot{StatusCode: 201, Header: http.Header{}, Body: []byte(strings.Repeat("x", bodySize))}}
}

func TestReplayCache_NeverHoldsARecordThatIsNotFinal(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(0, 0)}
	c := newReplayCache(1<<20, clock.now)
	processing := finalRecord("k", 10)
	processing.Status, processing.Snapshot = StatusProcessing, nil
	c.put(processing, time.Hour)
	require.Nil(t, c.get("s", "k"))

	noSnapshot := finalRecord("k", 10)
	noSnapshot.Snapshot = nil
	c.put(noSnapshot, time.Hour)
	require.Nil(t, c.get("s", "k"))
}

func TestReplayCache_EntryExpiresWithItsTTL(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(0, 0)}
	c := newReplayCache(1<<20, clock.now)
	c.put(finalRecord("k", 10), time.Minute)
	require.NotNil(t, c.get("s", "k"))
	clock.t = clock.t.Add(59 * time.Second)
	require.NotNil(t, c.get("s", "k"))
	clock.t = clock.t.Add(time.Second)
	require.Nil(t, c.get("s", "k"), "at the TTL the key may be new again in the store")
	require.Zero(t, c.size)
}

func TestReplayCache_IsBoundedByBytes_EvictingLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(0, 0)}
	c := newReplayCache(8*1024, clock.now)
	for i := range 20 {
		c.put(finalRecord(string(rune('a'+i)), 700), time.Hour)
		if i == 0 {
			continue
		}
		require.NotNil(t, c.get("s", "a"), "a recently used entry stays") // keep "a" hot
	}
	require.LessOrEqual(t, c.size, c.max)
	require.NotNil(t, c.get("s", "a"))
	require.Nil(t, c.get("s", "b"), "the least recently used entry was evicted")
	require.NotNil(t, c.get("s", "t"))
}

func TestReplayCache_SkipsAnswersLargerThanAnEighth(t *testing.T) {
	t.Parallel()
	c := newReplayCache(8*1024, (&fakeClock{t: time.Unix(0, 0)}).now)
	c.put(finalRecord("big", 2000), time.Hour)
	require.Nil(t, c.get("s", "big"))
}

func TestReplayCache_ScopesAreSeparate(t *testing.T) {
	t.Parallel()
	c := newReplayCache(1<<20, (&fakeClock{t: time.Unix(0, 0)}).now)
	rec := finalRecord("k", 1)
	rec.Scope = "ab"
	c.put(rec, time.Hour)
	require.Nil(t, c.get("a", "bk"), "scope and key are length-prefixed, not concatenated")
	require.NotNil(t, c.get("ab", "k"))
}

func TestReplayCache_NilIsDisabled(t *testing.T) {
	t.Parallel()
	var c *replayCache = newReplayCache(-1, time.Now)
	c.put(finalRecord("k", 1), time.Hour)
	require.Nil(t, c.get("s", "k"))
}
