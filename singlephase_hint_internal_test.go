package idempotency

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/internal/testdb"
)

// The hint reads while retries that miss the cache are frequent, and stops
// when a whole window met fewer records than the lower threshold allows: a
// window of new keys costs nothing more than single-phase's one statement.
// Between the two thresholds it keeps its state.
func TestReplayHint_ReadsWhileRetriesMissingTheCacheAreFrequent(t *testing.T) {
	t.Parallel()
	start := (replayHintWindow + replayReadFrom - 1) / replayReadFrom  // records that start reading
	keep := (replayHintWindow + replayStopBelow - 1) / replayStopBelow // records that keep it reading
	steps := []struct {
		name     string
		found    int // of the window's requests, how many met a record
		wantRead bool
	}{
		{"a window of new keys only: stop reading", 0, false},
		{"enough to keep reading is not enough to start", keep, false},
		{"one record too few to start", start - 1, false},
		{"enough records: read", start, true},
		{"fewer, but enough to keep reading", keep, true},
		{"every request a retry: keep reading", replayHintWindow, true},
		{"one record too few to keep reading", keep - 1, false},
		{"retries stop: stay off", 0, false},
	}
	var h replayHint
	require.True(t, h.request(), "a new process reads")
	h.seen.Store(0)
	for _, s := range steps {
		for i := range replayHintWindow {
			if i < s.found {
				h.record()
			}
			if i < replayHintWindow-1 {
				h.request()
			}
		}
		require.Equal(t, s.wantRead, h.request(), s.name)
	}
}

// With the hint not reading (a route whose retries are rare), a retry that
// misses the cache executes, collides with the record, rolls back and
// replays, as before: one execution survives. Retries that keep coming turn
// reading on within a window, and then they no longer execute.
func TestSinglePhase_RetriesWhileNotReading_ExecuteAndRollBack_ThenTurnReadingOn(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MySQL(t)
	ctx := context.Background()
	require.NoError(t, Migrate(ctx, db))
	_, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	mw, err := New(NewMySQLStore(db), &Config{Mode: ModeSinglePhase, ReplayCacheBytes: -1})
	require.NoError(t, err)
	var executions atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := TxFromContext(r.Context())
		res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ledger_id":%d}`, id)
	})))
	t.Cleanup(srv.Close)
	post := func() (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":5}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "entry-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	status, first := post()
	require.Equal(t, http.StatusCreated, status)
	mw.replayHint.skip.Store(true) // as after a window of new keys only
	mw.replayHint.seen.Store(0)
	mw.replayHint.found.Store(0)
	executions.Store(0)

	for i := range replayHintWindow {
		status, again := post()
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)
		if i == 0 {
			require.Equal(t, int64(1), executions.Load(), "not reading: the retry executed and rolled back")
		}
	}
	require.Equal(t, int64(replayHintWindow-1), executions.Load(), "the last request of the window read first")
	before := executions.Load()
	for range 10 {
		status, again := post()
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)
	}
	require.Equal(t, before, executions.Load(), "reading: retries no longer execute")
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM ledger").Scan(&n))
	require.Equal(t, 1, n, "only the first execution committed")
}

// blindCache is a SharedCache that holds nothing and reports its health:
// down (every call skipped, as idemredis while Redis is down) or up.
type blindCache struct {
	down    bool
	skipped atomic.Uint64
}

func (c *blindCache) GetReplay(context.Context, string, string) (*Record, time.Duration) {
	if c.down {
		c.skipped.Add(1)
	}
	return nil, 0
}

func (c *blindCache) PutReplay(context.Context, *Record, time.Duration) {
	if c.down {
		c.skipped.Add(1)
	}
}

func (c *blindCache) MarkInFlight(_ context.Context, _ InFlightMarker, _ time.Duration) (*InFlightMarker, bool) {
	if c.down {
		c.skipped.Add(1)
		return nil, false
	}
	return nil, true
}

func (c *blindCache) UnmarkInFlight(context.Context, InFlightMarker) {}

func (c *blindCache) MarkUnlessReplay(ctx context.Context, m InFlightMarker, ttl time.Duration) (*Record, time.Duration, *InFlightMarker, bool) {
	held, set := c.MarkInFlight(ctx, m, ttl)
	return nil, 0, held, set
}

func (c *blindCache) PutReplayAndUnmark(ctx context.Context, rec *Record, ttl time.Duration, m InFlightMarker) {
	if rec != nil {
		c.PutReplay(ctx, rec, ttl)
	}
}

func (c *blindCache) Health() SharedCacheHealth {
	return SharedCacheHealth{Up: !c.down, Skipped: c.skipped.Load()}
}

// With a shared cache answering a route's retries, the hint sees only new
// keys and stops reading first. When the shared cache then cannot answer
// (Redis down or slow: its calls fail or are skipped), a retry of a
// finished key on another instance reads the record and replays it instead
// of executing and rolling back; while the cache answers, a miss is a new
// key and nothing is read first, as before.
func TestSinglePhase_SharedCacheCouldNotAnswer_ReadsTheRecordFirstInsteadOfExecuting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		down           bool
		wantExecutions int64
	}{
		{"shared cache down: the retry reads the record and replays", true, 1},
		{"shared cache up but holding nothing: the retry executes and rolls back, as before", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, _ := testdb.MySQL(t)
			ctx := context.Background()
			require.NoError(t, Migrate(ctx, db))
			_, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(64) NOT NULL)")
			require.NoError(t, err)
			cache := &blindCache{}
			var collided atomic.Int64
			obs := ObserverFunc(func(_ context.Context, e Event) {
				if e.Outcome == OutcomeCollided {
					collided.Add(1)
				}
			})
			// Two instances on one database, neither with a replay cache.
			var executions atomic.Int64
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, _ := TxFromContext(r.Context())
				res, err := tx.ExecContext(r.Context(), "INSERT INTO ledger (note) VALUES ('entry')")
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				id, _ := res.LastInsertId()
				executions.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"ledger_id":%d}`, id)
			})
			var urls []string
			var mws []*Middleware
			for range 2 {
				mw, err := New(NewMySQLStore(db), &Config{Mode: ModeSinglePhase, ReplayCacheBytes: -1, SharedCache: cache, Observer: obs})
				require.NoError(t, err)
				mw.replayHint.skip.Store(true) // as after windows of new keys while Redis answered the retries
				mw.replayHint.seen.Store(1)
				srv := httptest.NewServer(mw.Handler(handler))
				t.Cleanup(srv.Close)
				urls, mws = append(urls, srv.URL), append(mws, mw)
			}
			post := func(url string) (int, string) {
				req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":5}`))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "entry-1")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp.StatusCode, string(body)
			}

			status, first := post(urls[0])
			require.Equal(t, http.StatusCreated, status)
			cache.down = tc.down
			status, again := post(urls[1])
			require.Equal(t, http.StatusCreated, status)
			require.Equal(t, first, again, "the retry on the other instance gets the first answer")
			require.Equal(t, tc.wantExecutions, executions.Load(), "handler runs for the create and its retry")
			require.Equal(t, tc.wantExecutions-1, collided.Load(), "executions that met the record and rolled back")
			var n int
			require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM ledger").Scan(&n))
			require.Equal(t, 1, n, "one entry committed either way")
			for _, mw := range mws {
				require.True(t, mw.replayHint.skip.Load(), "the hint itself is unchanged")
			}
		})
	}
}
