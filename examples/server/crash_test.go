package main

// Crash-safety tests with real processes and a real MariaDB or PostgreSQL
// (postgres_test.go runs the same tests there): the example
// server is built once, started as a child process, killed with SIGKILL (by
// its own IDEMPOTENCY_CRASH_POINT or by the test) and restarted, while a
// client retries the same Idempotency-Key with the same body. The rules:
//
//   - a key never produces more than one purchase_order row;
//   - an order a client was told about (201) is never lost, and its row is
//     the order the client was told about;
//   - after a restart every key gets a final answer within one lease plus one
//     reconcile interval (plus a small slack), and later retries replay that
//     answer byte for byte.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/history"
	"github.com/orderguard/idempotency/internal/testdb"
)

const (
	crashTestLease     = 2 * time.Second
	crashTestReconcile = 500 * time.Millisecond
	// crashTestSlack is what the answer may take beyond lease + reconcile
	// interval once the restarted server is ready: the client's polling
	// and a loaded machine's scheduling. The server's own start-up
	// (migrations, seed), which took up to 2s after a kill on a loaded CI
	// machine, is not the library's and is left out: the bound counts from
	// /healthz's first answer.
	crashTestSlack = 2 * time.Second
	// crashTestAnswerBound is the documented bound on the time from the
	// restarted server's readiness until a crashed key has its final answer.
	crashTestAnswerBound = crashTestLease + crashTestReconcile + crashTestSlack
)

var crashModes = []string{"claim-first", "single-phase"}

// crashBinDir holds the server binary; TestMain removes it.
var crashBinDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if crashBinDir != "" {
		_ = os.RemoveAll(crashBinDir)
	}
	os.Exit(code)
}

// crashServerBinary builds the server once per test binary run, on first use.
var crashServerBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "idempotency-crash-server-")
	if err != nil {
		return "", err
	}
	crashBinDir = dir
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(dir, "server")
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Dir = "." // go test runs in the package directory
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// crashFreePort picks a free loopback address.
func crashFreePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// crashProc is one run of the server process.
type crashProc struct {
	cmd     *exec.Cmd
	started time.Time // just before Start: the restart instant
	ready   time.Time // /healthz answered
	done    chan struct{}
	waitErr error // valid once done is closed
}

func (p *crashProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// killedBySIGKILL reports whether the process ended by SIGKILL.
func (p *crashProc) killedBySIGKILL() bool {
	var ee *exec.ExitError
	if !errors.As(p.waitErr, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// crashServer starts, kills and restarts the server on one address and one
// database; every run's output goes to one log file, printed on failure.
type crashServer struct {
	t       *testing.T
	bin     string
	addr    string
	args    []string
	logPath string
	logFile *os.File

	mu   sync.Mutex
	runs []*crashProc
}

// crashDatabase opens a fresh database: its handle and the server's -db
// URL naming it.
type crashDatabase func(t *testing.T) (*sql.DB, string)

// crashMySQL is a fresh MariaDB database.
func crashMySQL(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db, dsn := testdb.MySQL(t)
	return db, "mysql://" + dsn
}

func newCrashServer(t *testing.T, dbURL, mode string, extra ...string) *crashServer {
	t.Helper()
	bin, err := crashServerBinary()
	require.NoError(t, err)
	s := &crashServer{t: t, bin: bin, addr: crashFreePort(t)}
	s.args = append([]string{
		"-addr", s.addr, "-db", dbURL, "-mode", mode,
		"-lease", crashTestLease.String(), "-reconcile-interval", crashTestReconcile.String(),
	}, extra...)
	s.logPath = filepath.Join(t.TempDir(), "server.log")
	s.logFile, err = os.Create(s.logPath)
	require.NoError(t, err)
	t.Cleanup(func() {
		s.mu.Lock()
		runs := slices.Clone(s.runs)
		s.mu.Unlock()
		for _, p := range runs {
			if !p.exited() {
				_ = p.cmd.Process.Kill()
			}
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("server pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
			}
		}
		_ = s.logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(s.logPath)
			t.Logf("server log (%s):\n%s", s.logPath, out)
		}
	})
	return s
}

func (s *crashServer) url(path string) string { return "http://" + s.addr + path }

// start starts the server with crashPoint ("" for none) and waits until it
// answers /healthz. A process that exits before it is ready (for example
// because its port was taken meanwhile) is started again, a bounded number
// of times.
func (s *crashServer) start(crashPoint string) *crashProc {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		p := s.spawn(crashPoint)
		if s.waitReady(p, 15*time.Second) {
			return p
		}
		require.Less(s.t, attempt, 3, "server exited before it was ready (%v); see the log", p.waitErr)
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *crashServer) spawn(crashPoint string) *crashProc {
	s.t.Helper()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "IDEMPOTENCY_CRASH_POINT=")
	})
	if crashPoint != "" {
		env = append(env, "IDEMPOTENCY_CRASH_POINT="+crashPoint)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = s.logFile, s.logFile
	s.mu.Lock()
	fmt.Fprintf(s.logFile, "=== %s start #%d crash_point=%q args=%q\n",
		time.Now().Format("15:04:05.000"), len(s.runs)+1, crashPoint, s.args)
	s.mu.Unlock()
	p := &crashProc{cmd: cmd, done: make(chan struct{}), started: time.Now()}
	require.NoError(s.t, cmd.Start())
	s.mu.Lock()
	s.runs = append(s.runs, p)
	s.mu.Unlock()
	go func() {
		p.waitErr = cmd.Wait()
		s.mu.Lock()
		fmt.Fprintf(s.logFile, "=== %s pid %d ended: %v\n", time.Now().Format("15:04:05.000"), cmd.Process.Pid, p.waitErr)
		s.mu.Unlock()
		close(p.done)
	}()
	return p
}

func (s *crashServer) waitReady(p *crashProc, timeout time.Duration) bool {
	client := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return false
		}
		resp, err := client.Get(s.url("/healthz"))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Now()
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Failf(s.t, "server not ready", "no /healthz answer within %v", timeout)
	return false
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *crashServer) kill(p *crashProc) {
	s.t.Helper()
	_ = p.cmd.Process.Kill()
	s.waitExit(p, 10*time.Second)
}

func (s *crashServer) waitExit(p *crashProc, timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// crashAnswer is one HTTP exchange: a transport error or a response.
type crashAnswer struct {
	err    error
	status int
	header http.Header
	body   []byte
}

func (a crashAnswer) problemKind() string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return strings.TrimPrefix(p.Type, idempotency.ProblemTypePrefix)
}

// retryable: no final answer yet, so a client retries the same key.
func (a crashAnswer) retryable() bool {
	return a.err != nil || a.status >= 500 ||
		(a.status == http.StatusConflict && a.problemKind() == idempotency.ProblemInProgress)
}

func (a crashAnswer) String() string {
	if a.err != nil {
		return "transport error"
	}
	if k := a.problemKind(); k != "" {
		return strconv.Itoa(a.status) + " " + k
	}
	return strconv.Itoa(a.status)
}

func (a crashAnswer) orderNo(t *testing.T) string {
	t.Helper()
	var o orderservice.OrderResponse
	require.NoError(t, json.Unmarshal(a.body, &o), "body %q", a.body)
	require.NotEmpty(t, o.OrderNo)
	return o.OrderNo
}

// crashCreate is one create-order request: a user, a key and a fixed body.
type crashCreate struct {
	user int64
	key  string
	body []byte
	hist *history.Recorder // when set, every send is recorded (crash_history_test.go)
}

func newCrashCreate(user int64, key string) crashCreate {
	body, _ := json.Marshal(orderservice.CreateRequest{
		UserID: user, SKUID: orderservice.FirstSKU + user%100, Quantity: 1 + int(user%3),
	})
	return crashCreate{user: user, key: key, body: body}
}

func (c crashCreate) send(client *http.Client, url string) crashAnswer {
	return c.sendCtx(context.Background(), client, url)
}

func (c crashCreate) sendCtx(ctx context.Context, client *http.Client, url string) crashAnswer {
	if c.hist == nil {
		return c.post(ctx, client, url)
	}
	ctx, done := c.hist.BeginHTTP(ctx, c.historyRequest())
	a := c.post(ctx, client, url)
	done(a.historyResponse())
	return a
}

func (c crashCreate) post(ctx context.Context, client *http.Client, url string) crashAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(c.body))
	if err != nil {
		return crashAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", strconv.FormatInt(c.user, 10))
	req.Header.Set("Idempotency-Key", c.key)
	resp, err := client.Do(req)
	if err != nil {
		return crashAnswer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return crashAnswer{err: err}
	}
	return crashAnswer{status: resp.StatusCode, header: resp.Header, body: body}
}

// untilFinal retries c until it gets a final answer, deadline passes or ctx
// ends; it returns the final answer (zero if none), when it came, and a
// summary of the non-final answers on the way.
func (c crashCreate) untilFinal(ctx context.Context, client *http.Client, url string, deadline time.Time, pause func() time.Duration) (crashAnswer, time.Time, map[string]int) {
	seen := map[string]int{}
	for {
		a := c.sendCtx(ctx, client, url)
		if !a.retryable() {
			return a, time.Now(), seen
		}
		seen[a.String()]++
		if time.Now().After(deadline) || ctx.Err() != nil {
			return crashAnswer{}, time.Time{}, seen
		}
		time.Sleep(pause())
	}
}

type crashOrderRow struct {
	orderNo string
	count   int
}

// crashOrdersByKey reads purchase_order grouped by (scope, key).
func crashOrdersByKey(t *testing.T, db *sql.DB) (map[string]crashOrderRow, int) {
	t.Helper()
	rows, err := db.Query(`SELECT scope, idempotency_key, order_no FROM purchase_order`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]crashOrderRow{}
	total := 0
	for rows.Next() {
		var scope, key []byte
		var orderNo string
		require.NoError(t, rows.Scan(&scope, &key, &orderNo))
		k := string(scope) + "/" + string(key)
		r := out[k]
		r.count++
		r.orderNo = orderNo
		out[k] = r
		total++
	}
	require.NoError(t, rows.Err())
	return out, total
}

func crashRecordStatuses(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT status, COUNT(*) FROM idempotency_record GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		require.NoError(t, rows.Scan(&st, &n))
		out[st] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// crashPointCase says what one crash point does in one mode.
type crashPointCase struct {
	mode, point string
	// fires: the first create kills the server. Otherwise firstStatus is
	// what it answers instead.
	fires       bool
	firstStatus int
	why         string
}

func crashPointCases() []crashPointCase {
	var cases []crashPointCase
	for _, point := range crashPoints {
		cases = append(cases, crashPointCase{mode: "claim-first", point: point, fires: true})
	}
	cases = append(cases,
		crashPointCase{mode: "single-phase", point: crashAfterClaim, firstStatus: http.StatusCreated,
			why: "single-phase never claims a key, so the point is never reached: the create succeeds"},
		crashPointCase{mode: "single-phase", point: crashInHandler, fires: true},
		// The order row and the DONE record are written inside the business
		// transaction (InsertFinal) before COMMIT: the point exists in this
		// mode too, and a crash there must roll both back.
		crashPointCase{mode: "single-phase", point: crashDuringFinalize, fires: true},
		crashPointCase{mode: "single-phase", point: crashAfterCommit, fires: true},
		crashPointCase{mode: "single-phase", point: crashDuringRelease, firstStatus: http.StatusInternalServerError,
			why: "single-phase has no claim to release: the injected handler failure answers 500, writes nothing and the server lives"},
	)
	return cases
}

// TestCrashAtEveryPoint_RetryAfterRestartCreatesOneOrderWithinLeasePlusReconcileAndReplaysItByteForByte
// kills the server at each crash point (SIGKILL from inside, at the first
// request that reaches it), restarts it without the crash point and retries
// the same key with the same body.
func TestCrashAtEveryPoint_RetryAfterRestartCreatesOneOrderWithinLeasePlusReconcileAndReplaysItByteForByte(t *testing.T) {
	testCrashAtEveryPoint(t, crashMySQL)
}

func testCrashAtEveryPoint(t *testing.T, open crashDatabase) {
	var (
		mu      sync.Mutex
		results []string
	)
	t.Cleanup(func() {
		slices.Sort(results)
		t.Logf("crash-point results (bound %v = lease %v + reconcile %v + slack %v):\n  %s",
			crashTestAnswerBound, crashTestLease, crashTestReconcile, crashTestSlack, strings.Join(results, "\n  "))
	})
	for _, tc := range crashPointCases() {
		t.Run(tc.mode+"/"+tc.point, func(t *testing.T) {
			t.Parallel()
			db, dbURL := open(t)
			srv := newCrashServer(t, dbURL, tc.mode)
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			url := srv.url("/orders")
			create := newCrashCreate(7, "crash-"+tc.mode+"-"+tc.point)
			create.hist = history.NewRecorder()

			first := srv.start(tc.point)
			firstAnswer := create.send(client, url)
			if tc.fires {
				require.True(t, srv.waitExit(first, 5*time.Second),
					"crash point %s in %s: the server must SIGKILL itself at the first create, but it is alive; the client got %s %q",
					tc.point, tc.mode, firstAnswer, firstAnswer.body)
				require.True(t, first.killedBySIGKILL(), "want the server killed by SIGKILL, Wait returned %v", first.waitErr)
				require.Equal(t, "signal: killed", first.waitErr.Error())
				require.Error(t, firstAnswer.err, "the client of a crashed request must see a transport error, got %d %q",
					firstAnswer.status, firstAnswer.body)
			} else {
				require.NoError(t, firstAnswer.err, "%s: %s", tc.point, tc.why)
				require.Equal(t, tc.firstStatus, firstAnswer.status, "%s: %s; body %q", tc.point, tc.why, firstAnswer.body)
				require.False(t, srv.waitExit(first, 300*time.Millisecond), "%s: %s; but the server died: %v", tc.point, tc.why, first.waitErr)
				rows, total := crashOrdersByKey(t, db)
				wantRows := 0
				if tc.firstStatus == http.StatusCreated {
					wantRows = 1
					require.Equal(t, firstAnswer.orderNo(t), rows["7/"+create.key].orderNo)
				}
				require.Equal(t, wantRows, total, "orders after the first create")
				srv.kill(first)
			}

			// Restart without the crash point and retry the same key.
			second := srv.start("")
			answer, answeredAt, interim := create.untilFinal(t.Context(), client, url,
				second.started.Add(crashTestAnswerBound+5*time.Second), func() time.Duration { return 50 * time.Millisecond })
			require.NotZero(t, answer.status, "the key got no final answer %v after the restart; answers seen: %v",
				crashTestAnswerBound+5*time.Second, interim)
			sinceRestart := answeredAt.Sub(second.started)
			sinceReady := answeredAt.Sub(second.ready)
			mu.Lock()
			results = append(results, fmt.Sprintf("%-12s %-15s died=%-5v first=%-15s retry=%d replayed=%-5v answered %5dms after restart (%5dms after ready), interim %v",
				tc.mode, tc.point, tc.fires, firstAnswer.String(), answer.status, answer.header.Get("Idempotent-Replayed") == "true",
				sinceRestart.Milliseconds(), sinceReady.Milliseconds(), interim))
			mu.Unlock()
			require.Equal(t, http.StatusCreated, answer.status, "the retry's final answer; body %q", answer.body)
			require.LessOrEqual(t, sinceReady, crashTestAnswerBound,
				"time from the restarted server's readiness to the final answer must be at most lease + reconcile interval + slack")

			// Exactly one order, the one the retry was told about.
			orderNo := answer.orderNo(t)
			require.Equal(t, "/orders/"+orderNo, answer.header.Get("Location"))
			rows, total := crashOrdersByKey(t, db)
			require.Equal(t, 1, total, "purchase_order rows in the database")
			require.Equal(t, crashOrderRow{orderNo: orderNo, count: 1}, rows["7/"+create.key])
			if !tc.fires && tc.firstStatus == http.StatusCreated {
				require.Equal(t, firstAnswer.body, answer.body, "the answer before the restart and after it")
			}

			// Two later retries replay it byte for byte.
			for i := range 2 {
				replay := create.send(client, url)
				require.NoError(t, replay.err)
				require.Equal(t, http.StatusCreated, replay.status, "replay %d: %q", i+1, replay.body)
				require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"), "replay %d", i+1)
				require.Equal(t, answer.header.Get("Location"), replay.header.Get("Location"), "replay %d", i+1)
				require.Equal(t, string(answer.body), string(replay.body), "replay %d must be byte-identical to the retry's answer", i+1)
			}
			_, total = crashOrdersByKey(t, db)
			require.Equal(t, 1, total, "purchase_order rows after the replays")
			require.Equal(t, map[string]int{"DONE": 1}, crashRecordStatuses(t, db), "idempotency records")
			require.False(t, second.exited(), "the restarted server must stay up: %v", second.waitErr)
			checkCrashHistory(t, db, create.hist)
		})
	}
}

// crashKeyResult is what one client saw for one key.
type crashKeyResult struct {
	create     crashCreate
	final      crashAnswer // zero when the key never got a final answer
	answeredAt time.Time
	took       time.Duration // first send to final answer
	interim    map[string]int
}

// TestRandomKill9_NoDuplicateNoLostAcknowledgedOrderAndEveryKeyAnswered runs
// 24 concurrent clients, each with its own user and its own keys, against a
// server that is kill -9'd at random moments and restarted. Each client
// creates orders one key after another (so that kills land on requests in
// flight) and retries every key with the same body until it gets a final
// answer; a 201 is an acknowledged order.
func TestRandomKill9_NoDuplicateNoLostAcknowledgedOrderAndEveryKeyAnswered(t *testing.T) {
	testRandomKill9(t, crashMySQL)
}

func testRandomKill9(t *testing.T, open crashDatabase) {
	const (
		clients      = 24
		kills        = 5
		maxKeysPer   = 200
		handlerDelay = 20 * time.Millisecond
	)
	for _, mode := range crashModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db, dbURL := open(t)
			srv := newCrashServer(t, dbURL, mode, "-handler-delay", handlerDelay.String())
			url := srv.url("/orders")
			current := srv.start("")

			// Clients stop when the test ends, even if it ends early.
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			hardDeadline := time.Now().Add(40 * time.Second)
			chaosOver := make(chan struct{})
			results := make([][]crashKeyResult, clients)
			hist := history.NewRecorder()
			var wg sync.WaitGroup
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					client := &http.Client{Timeout: 10 * time.Second}
					user := int64(100 + i)
					for k := range maxKeysPer {
						select {
						case <-chaosOver:
							if k > 0 {
								return
							}
						default:
						}
						c := newCrashCreate(user, fmt.Sprintf("rk-%d-%03d", user, k))
						c.hist = hist
						start := time.Now()
						final, at, interim := c.untilFinal(ctx, client, url, hardDeadline, func() time.Duration {
							return time.Duration(20+rand.IntN(30)) * time.Millisecond
						})
						results[i] = append(results[i], crashKeyResult{create: c, final: final, answeredAt: at, took: at.Sub(start), interim: interim})
						if final.status == 0 {
							return // past the hard deadline
						}
					}
				}()
			}

			killedAt := make([]time.Duration, 0, kills)
			for range kills {
				time.Sleep(time.Duration(50+rand.IntN(351)) * time.Millisecond)
				killedAt = append(killedAt, time.Since(current.ready).Round(time.Millisecond))
				srv.kill(current)
				require.True(t, current.killedBySIGKILL(), "Wait returned %v", current.waitErr)
				current = srv.start("")
			}
			lastRestart, lastReady := current.started, current.ready
			close(chaosOver)

			allDone := make(chan struct{})
			go func() { wg.Wait(); close(allDone) }()
			select {
			case <-allDone:
			case <-time.After(time.Until(hardDeadline) + 15*time.Second):
				require.FailNow(t, "clients did not finish")
			}
			require.False(t, current.exited(), "the last server must still be up: %v", current.waitErr)

			// Tally.
			var (
				keys         []crashKeyResult
				unanswered   []string
				unexpected   []string
				interimTotal = map[string]int{}
				lastAnswer   time.Time
				slowest      time.Duration
			)
			for _, rs := range results {
				for _, r := range rs {
					keys = append(keys, r)
					for k, n := range r.interim {
						interimTotal[k] += n
					}
					switch {
					case r.final.status == 0:
						unanswered = append(unanswered, r.create.key)
					case r.final.status != http.StatusCreated:
						unexpected = append(unexpected, fmt.Sprintf("%s: %s %q", r.create.key, r.final, r.final.body))
					}
					if r.answeredAt.After(lastAnswer) {
						lastAnswer = r.answeredAt
					}
					slowest = max(slowest, r.took)
				}
			}
			drain := lastAnswer.Sub(lastReady)
			t.Logf("%s: %d keys from %d clients, %d kills at %v after each start; non-final answers on the way: %v; "+
				"slowest key %v; last key answered %v after the last restart was ready (it started in %v; bound %v)",
				mode, len(keys), clients, kills, killedAt, interimTotal, slowest.Round(time.Millisecond),
				drain.Round(time.Millisecond), lastReady.Sub(lastRestart).Round(time.Millisecond), crashTestAnswerBound)

			require.Positive(t, interimTotal["transport error"], "the kills must hit requests in flight")
			require.Empty(t, unanswered, "keys left without a final answer")
			require.Empty(t, unexpected, "keys answered with something other than 201")
			require.LessOrEqual(t, drain, crashTestAnswerBound,
				"every key must be answered within lease + reconcile interval + slack of the last restart's readiness")

			orders, total := crashOrdersByKey(t, db)
			var duplicates, missing, wrong []string
			for _, r := range keys {
				k := strconv.FormatInt(r.create.user, 10) + "/" + r.create.key
				row := orders[k]
				switch {
				case row.count > 1:
					duplicates = append(duplicates, fmt.Sprintf("%s: %d rows", k, row.count))
				case row.count == 0:
					missing = append(missing, k)
				case row.orderNo != r.final.orderNo(t):
					wrong = append(wrong, fmt.Sprintf("%s: acknowledged %s, stored %s", k, r.final.orderNo(t), row.orderNo))
				}
			}
			require.Empty(t, duplicates, "duplicate orders")
			require.Empty(t, missing, "acknowledged orders missing")
			require.Empty(t, wrong, "stored order differs from the acknowledged one")
			require.Equal(t, len(keys), total, "purchase_order rows == keys")
			require.Equal(t, map[string]int{"DONE": len(keys)}, crashRecordStatuses(t, db), "idempotency records")

			// Every key still replays its acknowledged answer byte for byte.
			client := &http.Client{Timeout: 10 * time.Second}
			var mismatches []string
			var mmu sync.Mutex
			var rwg sync.WaitGroup
			work := make(chan crashKeyResult)
			for range 8 {
				rwg.Add(1)
				go func() {
					defer rwg.Done()
					for r := range work {
						a := r.create.send(client, url)
						if a.err != nil || a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" ||
							!bytes.Equal(a.body, r.final.body) {
							mmu.Lock()
							mismatches = append(mismatches, fmt.Sprintf("%s: %v %s %q, acknowledged %q", r.create.key, a.err, a, a.body, r.final.body))
							mmu.Unlock()
						}
					}
				}()
			}
			for _, r := range keys {
				work <- r
			}
			close(work)
			rwg.Wait()
			require.Empty(t, mismatches, "replays after the crashes")
			checkCrashHistory(t, db, hist)
		})
	}
}
