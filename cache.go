package idempotency

import (
	"container/list"
	"strconv"
	"sync"
	"time"
)

// replayCache keeps finished records in process, bounded by bytes, so that a
// replay needs no database round trip. Only final records enter it: they
// never change before their retention ends, and an entry expires before its
// record does. A nil *replayCache is a disabled cache.
type replayCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	order *list.List // front: most recently used
	items map[string]*list.Element
	now   func() time.Time
}

type cacheEntry struct {
	id      string
	rec     *Record
	size    int64
	expires time.Time // by this process's monotonic clock
}

func newReplayCache(maxBytes int64, now func() time.Time) *replayCache {
	if maxBytes <= 0 {
		return nil
	}
	return &replayCache{max: maxBytes, order: list.New(), items: map[string]*list.Element{}, now: now}
}

func cacheID(scope, key string) string { return strconv.Itoa(len(scope)) + ":" + scope + key }

// get returns a cached final record, or nil.
func (c *replayCache) get(scope, key string) *Record {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[cacheID(scope, key)]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !c.now().Before(e.expires) {
		c.remove(el)
		return nil
	}
	c.order.MoveToFront(el)
	return e.rec
}

// put caches a final record for ttl, measured from now. The caller derives
// ttl from the store's clock (ExpiresAt - ReadAt) or from the retention it
// just wrote, minus a margin, so the entry dies before the record does.
func (c *replayCache) put(rec *Record, ttl time.Duration) {
	if c == nil || !rec.Status.Final() || rec.Snapshot == nil || ttl <= 0 {
		return
	}
	size := int64(len(rec.Snapshot.Body) + len(rec.Scope) + len(rec.Key) + len(rec.Fingerprint) + 256)
	for k, v := range rec.Snapshot.Header {
		size += int64(len(k))
		for _, s := range v {
			size += int64(len(s))
		}
	}
	if size > c.max/8 { // one large answer must not flush the cache
		return
	}
	id := cacheID(rec.Scope, rec.Key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[id]; ok {
		c.remove(el)
	}
	c.items[id] = c.order.PushFront(&cacheEntry{id: id, rec: rec, size: size, expires: c.now().Add(ttl)})
	c.size += size
	for c.size > c.max {
		c.remove(c.order.Back())
	}
}

func (c *replayCache) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.order.Remove(el)
	delete(c.items, e.id)
	c.size -= e.size
}

// cacheMargin is how much sooner than its record a cache entry expires, to
// cover the time between the store computing expires_at and this process
// starting the entry's clock.
func cacheMargin(ttl time.Duration) time.Duration {
	return min(time.Second, ttl/10)
}
