package idempotency_test

import (
	"context"
	"database/sql"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// batchBundle is a Middleware over a fresh MariaDB database with a table
// the runs write their effect to, one row per key.
type batchBundle struct {
	db    *sql.DB
	store *flakyStore
	mw    *idempotency.Middleware

	mu   sync.Mutex
	runs map[string]int
	txs  map[string]*sql.Tx
}

func setupBatch(t *testing.T, mode idempotency.Mode) *batchBundle {
	t.Helper()
	db := newMySQL(t)
	_, err := db.Exec(`CREATE TABLE effect (k VARCHAR(64) PRIMARY KEY)`)
	require.NoError(t, err)
	b := &batchBundle{db: db, store: &flakyStore{Store: idempotency.NewMySQLStore(db), failKeys: map[string]int{}},
		runs: map[string]int{}, txs: map[string]*sql.Tx{}}
	b.mw, err = idempotency.New(b.store, &idempotency.Config{Mode: mode, Lease: 5 * time.Second})
	require.NoError(t, err)
	return b
}

// action is key's action, whose run writes its effect and answers status
// (a 2xx with the key as its body).
func (b *batchBundle) action(key string, status int) idempotency.BatchAction {
	return b.actionFP(key, "fp", status)
}

func (b *batchBundle) actionFP(key, fp string, status int) idempotency.BatchAction {
	return idempotency.BatchAction{
		Action: idempotency.Action{Scope: "s", Key: key, Fingerprint: fp},
		Run: func(ctx context.Context) idempotency.Result {
			tx, ok := idempotency.TxFromContext(ctx)
			if !ok {
				panic("no transaction")
			}
			b.mu.Lock()
			b.runs[key]++
			b.txs[key] = tx
			b.mu.Unlock()
			if _, err := tx.ExecContext(ctx, `INSERT INTO effect (k) VALUES (?)`, key); err != nil {
				return idempotency.Result{Status: http.StatusServiceUnavailable}
			}
			return idempotency.Result{Status: status, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte(key)}
		},
	}
}

func (b *batchBundle) effects(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM effect WHERE k = ?`, key).Scan(&n))
	return n
}

func (b *batchBundle) runCount(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[key]
}

// flakyStore fails the record write (FinishTx, InsertFinal in a
// transaction) of a key as a deadlock's victim does, as often as armed.
type flakyStore struct {
	idempotency.Store
	mu       sync.Mutex
	failKeys map[string]int
}

var errDeadlock = &mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'},
	Message: "Deadlock found when trying to get lock; try restarting transaction"}

func (f *flakyStore) fail(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failKeys[key] > 0 {
		f.failKeys[key]--
		return true
	}
	return false
}

func (f *flakyStore) FinishTx(ctx context.Context, tx *sql.Tx, l idempotency.Lease, st idempotency.Status, snap *idempotency.Snapshot, retention time.Duration) (idempotency.Lease, error) {
	if f.fail(l.Key) {
		return idempotency.Lease{}, errDeadlock
	}
	return f.Store.FinishTx(ctx, tx, l, st, snap, retention)
}

func (f *flakyStore) InsertFinal(ctx context.Context, tx *sql.Tx, c idempotency.Claim, st idempotency.Status, snap *idempotency.Snapshot) error {
	if tx != nil && f.fail(c.Key) {
		return errDeadlock
	}
	return f.Store.InsertFinal(ctx, tx, c, st, snap)
}

func forBothModes(t *testing.T, spec func(t *testing.T, mode idempotency.Mode)) {
	for _, m := range []struct {
		name string
		mode idempotency.Mode
	}{{"claim-first", idempotency.ModeClaimFirst}, {"single-phase", idempotency.ModeSinglePhase}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			spec(t, m.mode)
		})
	}
}

func TestDoBatch_CommitsEveryRunInOneTransaction(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		keys := []string{"a", "b", "c", "d"}
		var batch []idempotency.BatchAction
		for _, k := range keys {
			batch = append(batch, b.action(k, http.StatusCreated))
		}
		answers := b.mw.DoBatch(context.Background(), batch)
		require.Len(t, answers, len(keys))
		for i, k := range keys {
			a := answers[i]
			require.Nil(t, a.Problem, "answer %d: %+v", i, a.Problem)
			require.Equal(t, http.StatusCreated, a.Status)
			require.False(t, a.Replayed)
			require.Equal(t, k, string(a.Body), "each action gets its own run's answer, in order")
			require.Equal(t, 1, b.effects(t, k))
			require.Equal(t, 1, b.runCount(k))
			require.Same(t, b.txs[keys[0]], b.txs[k], "every run of the batch ran in one transaction")
		}
		// Every record committed: each key replays now, without running.
		again := b.mw.DoBatch(context.Background(), batch)
		for i, a := range again {
			require.True(t, a.Replayed, "answer %d replays", i)
			require.Equal(t, keys[i], string(a.Body))
			require.Equal(t, 1, b.runCount(keys[i]), "a finished key does not run again")
		}
	})
}

// A run that refuses (a final 422) costs the batch its transaction: every
// action is then done alone, the refusal recorded, the others committed,
// each effect once.
func TestDoBatch_ARefusedRun_FallsBackToOneByOne_TheOthersCommit(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		batch := []idempotency.BatchAction{
			b.action("ok-1", http.StatusCreated), b.action("refused", http.StatusUnprocessableEntity), b.action("ok-2", http.StatusCreated),
		}
		answers := b.mw.DoBatch(context.Background(), batch)
		require.Equal(t, http.StatusCreated, answers[0].Status)
		require.Equal(t, http.StatusUnprocessableEntity, answers[1].Status, "%+v", answers[1].Problem)
		require.Equal(t, http.StatusCreated, answers[2].Status)
		require.Equal(t, 1, b.effects(t, "ok-1"))
		require.Equal(t, 0, b.effects(t, "refused"), "a refusal is rolled back")
		require.Equal(t, 1, b.effects(t, "ok-2"))
		require.Equal(t, 2, b.runCount("ok-1"), "run in the batch, rolled back, and alone")
		require.Equal(t, 1, b.runCount("ok-2"), "never run in the batch: the refusal came first")
		refused := b.mw.Do(context.Background(), batch[1].Action, batch[1].Run)
		require.True(t, refused.Replayed, "the refusal was recorded")
		require.Equal(t, http.StatusUnprocessableEntity, refused.Status)
	})
}

// A record the database refuses (a deadlock at the record's write) rolls
// the batch back; alone, every action commits once.
func TestDoBatch_ARecordTheDatabaseRefused_FallsBackToOneByOne(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		b.store.failKeys["b"] = 1
		batch := []idempotency.BatchAction{b.action("a", 201), b.action("b", 201), b.action("c", 201)}
		answers := b.mw.DoBatch(context.Background(), batch)
		for i, a := range answers {
			require.Nil(t, a.Problem, "answer %d: %+v", i, a.Problem)
			require.Equal(t, http.StatusCreated, a.Status)
		}
		for _, k := range []string{"a", "b", "c"} {
			require.Equal(t, 1, b.effects(t, k), "key %s: one effect", k)
		}
		require.Equal(t, 2, b.runCount("b"), "b ran in the batch and again alone")
	})
}

// A panicking run is answered as Do answers it; the others commit.
func TestDoBatch_APanickingRun_IsAnsweredAlone_TheOthersCommit(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		boom := idempotency.BatchAction{Action: idempotency.Action{Scope: "s", Key: "boom", Fingerprint: "fp"},
			Run: func(ctx context.Context) idempotency.Result { panic("boom") }}
		answers := b.mw.DoBatch(context.Background(), []idempotency.BatchAction{b.action("a", 201), boom, b.action("c", 201)})
		require.Equal(t, http.StatusCreated, answers[0].Status)
		require.NotNil(t, answers[1].Problem)
		require.Equal(t, idempotency.ProblemExecutionFailed, answers[1].Problem.Kind())
		require.Equal(t, http.StatusCreated, answers[2].Status)
		require.Equal(t, 1, b.effects(t, "a"))
		require.Equal(t, 1, b.effects(t, "c"))
	})
}

// The same key twice in one batch: the second waits for the batch and
// replays the first; with another fingerprint it is a conflict. Neither
// runs.
func TestDoBatch_AKeyTwiceInABatch_RunsOnce_TheSecondReplaysOrConflicts(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		answers := b.mw.DoBatch(context.Background(), []idempotency.BatchAction{
			b.action("k", 201), b.action("other", 201), b.action("k", 201), b.actionFP("k", "changed", 201),
		})
		require.Equal(t, http.StatusCreated, answers[0].Status)
		require.False(t, answers[0].Replayed)
		require.True(t, answers[2].Replayed, "the duplicate replays the first: %+v", answers[2])
		require.Equal(t, answers[0].Body, answers[2].Body)
		require.NotNil(t, answers[3].Problem)
		require.Equal(t, idempotency.ProblemKeyReused, answers[3].Problem.Kind())
		require.Equal(t, 1, b.runCount("k"))
		require.Equal(t, 1, b.effects(t, "k"))
	})
}

// Actions the protocol answers without running are answered so in a
// batch, and the batch commits the rest: a bad key is refused, a key
// another attempt holds (claim-first) is in progress.
func TestDoBatch_AnswersWithoutRunning_TheRestCommit(t *testing.T) {
	t.Parallel()
	forBothModes(t, func(t *testing.T, mode idempotency.Mode) {
		b := setupBatch(t, mode)
		_, err := b.store.Claim(context.Background(), idempotency.Claim{Scope: "s", Key: "held", Fingerprint: "fp",
			Owner: "elsewhere/1", Lease: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		answers := b.mw.DoBatch(context.Background(), []idempotency.BatchAction{
			b.action("", 201), b.action("held", 201), b.action("fine", 201),
		})
		require.NotNil(t, answers[0].Problem)
		require.Equal(t, idempotency.ProblemInvalidKey, answers[0].Problem.Kind())
		require.Equal(t, http.StatusCreated, answers[2].Status)
		require.Equal(t, 1, b.effects(t, "fine"))
		require.Zero(t, b.effects(t, "held"), "a key held elsewhere never runs here")
		if mode == idempotency.ModeClaimFirst {
			require.NotNil(t, answers[1].Problem, "%+v", answers[1])
			require.Equal(t, idempotency.ProblemInProgress, answers[1].Problem.Kind())
			require.Positive(t, answers[1].Problem.RetryAfter)
		} else {
			// Single-phase runs it, meets the held record and answers its
			// state: in progress.
			require.NotNil(t, answers[1].Problem, "%+v", answers[1])
			require.Equal(t, idempotency.ProblemInProgress, answers[1].Problem.Kind())
		}
	})
}
