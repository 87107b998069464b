package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// op is one operation of a hand-written history: times in milliseconds
// from the recorder's start.
type op struct {
	key, fp   string
	call, ret int
	resp      Response
}

func record(ops ...op) *Recorder {
	r := NewRecorder()
	for _, o := range ops {
		ms := func(n int) time.Time { return r.base.Add(time.Duration(n) * time.Millisecond) }
		r.Add(Request{Key: o.key, Fingerprint: o.fp}, ms(o.call), ms(o.ret), o.resp)
	}
	return r
}

func created(order string) Response {
	return Response{Status: 201, Body: fmt.Sprintf(`{"order_no":%q}`, order)}
}

func replayed(order string) Response {
	r := created(order)
	r.Replayed = true
	return r
}

var (
	rejected      = Response{Status: 422, Body: `{"type":"unknown-sku"}`}
	rejectReplay  = Response{Status: 422, Body: `{"type":"unknown-sku"}`, Replayed: true}
	inProgress    = Response{Status: 409, Problem: "in-progress", RetryAfter: "1"}
	unavailable   = Response{Status: 503, Problem: "store-unavailable", RetryAfter: "1"}
	commitUnknown = Response{Status: 503, Problem: "commit-outcome-unknown", RetryAfter: "1"}
	handlerFailed = Response{Status: 500, Problem: "execution-failed"}
	reused        = Response{Status: 409, Problem: "key-reused"}
	noAnswer      = Failed(errors.New("read tcp: connection reset by peer"))
)

var orderNo = Config{OrderOf: JSONField("order_no")}

// histories the contract allows, with what the orders table holds.
var legal = []struct {
	name   string
	ops    []op
	orders Orders
}{
	{"an executed 201, then replays of it", []op{
		{"k", "a", 0, 10, created("A")}, {"k", "a", 20, 21, replayed("A")}, {"k", "a", 30, 31, replayed("A")},
	}, Orders{"k": {"A"}}},
	{"a duplicate answered in-progress while the first executes", []op{
		{"k", "a", 0, 10, created("A")}, {"k", "a", 2, 3, inProgress}, {"k", "a", 4, 12, replayed("A")},
	}, Orders{"k": {"A"}}},
	{"503s and a handler's 500 record nothing: a later request executes", []op{
		{"k", "a", 0, 1, unavailable}, {"k", "a", 2, 3, handlerFailed}, {"k", "a", 4, 5, created("A")},
	}, Orders{"k": {"A"}}},
	{"a request without an answer committed: the retry replays its order", []op{
		{"k", "a", 0, 1, noAnswer}, {"k", "a", 2, 3, replayed("A")},
	}, Orders{"k": {"A"}}},
	{"a request without an answer committed nothing: the retry executes", []op{
		{"k", "a", 0, 1, noAnswer}, {"k", "a", 2, 3, created("B")},
	}, Orders{"k": {"B"}}},
	{"a request without an answer, never retried: an order", []op{
		{"k", "a", 0, 1, noAnswer},
	}, Orders{"k": {"A"}}},
	{"a request without an answer, never retried: no order", []op{
		{"k", "a", 0, 1, noAnswer},
	}, Orders{}},
	{"a lost COMMIT answered commit-outcome-unknown lands after the answer: the retry replays it", []op{
		{"k", "a", 0, 1, commitUnknown}, {"k", "a", 2, 3, unavailable}, {"k", "a", 4, 5, replayed("A")},
	}, Orders{"k": {"A"}}},
	{"a final 4xx stored, then replayed", []op{
		{"k", "a", 0, 1, rejected}, {"k", "a", 2, 3, rejectReplay},
	}, Orders{}},
	{"a final 4xx that could not be stored is answered again by the retry", []op{
		{"k", "a", 0, 1, rejected}, {"k", "a", 2, 3, rejected},
	}, Orders{}},
	{"another fingerprint after the answer is key-reused", []op{
		{"k", "a", 0, 1, created("A")}, {"k", "b", 2, 3, reused},
	}, Orders{"k": {"A"}}},
	{"another fingerprint while the first is claimed is key-reused", []op{
		{"k", "a", 0, 10, unavailable}, {"k", "b", 2, 3, reused},
	}, Orders{}},
	{"keys are independent", []op{
		{"k1", "a", 0, 10, created("A")}, {"k2", "a", 0, 10, created("B")}, {"k1", "a", 11, 12, replayed("A")},
	}, Orders{"k1": {"A"}, "k2": {"B"}}},
}

func TestCheck_HistoriesTheContractAllows_Pass(t *testing.T) {
	for _, c := range legal {
		t.Run(c.name, func(t *testing.T) {
			res := record(c.ops...).Verify(c.orders, orderNo)
			require.True(t, res.OK(), "%s", res.Report(5))
			require.Equal(t, len(c.ops), res.Operations)
		})
	}
}

// doctored are histories that break the contract, each as a real fault run
// would show the breach.
var doctored = []struct {
	name   string
	ops    []op
	orders Orders
}{
	{"a replay differs from the first answer", []op{
		{"k", "a", 0, 1, created("A")}, {"k", "a", 2, 3, replayed("B")},
	}, Orders{"k": {"A"}}},
	{"two executed 201s with distinct orders for one key", []op{
		{"k", "a", 0, 1, created("A")}, {"k", "a", 2, 3, created("B")},
	}, Orders{"k": {"B"}}},
	{"two executed 201s, both while the other ran", []op{
		{"k", "a", 0, 10, created("A")}, {"k", "a", 1, 11, created("B")},
	}, Orders{"k": {"A"}}},
	{"a replay although every earlier answer said nothing was recorded", []op{
		{"k", "a", 0, 1, unavailable}, {"k", "a", 2, 3, inProgress}, {"k", "a", 4, 5, replayed("A")},
	}, Orders{"k": {"A"}}},
	{"a replay answered before the request that executed was sent", []op{
		{"k", "a", 0, 1, replayed("A")}, {"k", "a", 2, 3, created("A")},
	}, Orders{"k": {"A"}}},
	{"a 201 replay of a stored rejection", []op{
		{"k", "a", 0, 1, noAnswer}, {"k", "a", 2, 3, rejectReplay}, {"k", "a", 4, 5, replayed("A")},
	}, Orders{}},
	{"key-reused for the same fingerprint", []op{
		{"k", "a", 0, 1, created("A")}, {"k", "a", 2, 3, reused},
	}, Orders{"k": {"A"}}},
	{"key-reused with no other fingerprint ever sent", []op{
		{"k", "a", 0, 1, reused},
	}, Orders{}},
	{"in-progress without Retry-After", []op{
		{"k", "a", 0, 10, created("A")}, {"k", "a", 2, 3, Response{Status: 409, Problem: "in-progress"}},
	}, Orders{"k": {"A"}}},
	{"two orders for one key", []op{
		{"k", "a", 0, 1, created("A")}, {"k", "a", 2, 3, replayed("A")},
	}, Orders{"k": {"A", "B"}}},
	{"two orders for a key whose requests got no answer", []op{
		{"k", "a", 0, 1, noAnswer}, {"k", "a", 2, 3, noAnswer},
	}, Orders{"k": {"A", "B"}}},
	{"an order for a key whose every answer said nothing was recorded", []op{
		{"k", "a", 0, 1, unavailable}, {"k", "a", 2, 3, handlerFailed},
	}, Orders{"k": {"A"}}},
	{"the 201 names another order than the table holds", []op{
		{"k", "a", 0, 1, created("A")},
	}, Orders{"k": {"B"}}},
	{"an acknowledged order is missing", []op{
		{"k", "a", 0, 1, created("A")},
	}, Orders{}},
	{"an order for a key answered with a final rejection", []op{
		{"k", "a", 0, 1, rejected}, {"k", "a", 2, 3, rejectReplay},
	}, Orders{"k": {"A"}}},
	{"the order a lost request committed differs from its replay", []op{
		{"k", "a", 0, 1, noAnswer}, {"k", "a", 2, 3, replayed("A")},
	}, Orders{"k": {"B"}}},
}

func TestCheck_DoctoredHistories_AreCaughtAndTheirKeysNamed(t *testing.T) {
	for _, c := range doctored {
		t.Run(c.name, func(t *testing.T) {
			fine := op{"other", "a", 0, 1, created("Z")} // a legal key beside it
			res := record(append(c.ops, fine)...).Verify(withOrder(c.orders, "other", "Z"), orderNo)
			require.False(t, res.OK(), "the model accepted: %s", c.name)
			require.Equal(t, []string{"k"}, res.Illegal)
			require.Contains(t, res.Report(5), "key k:")
		})
	}
}

func withOrder(o Orders, key, id string) Orders {
	out := Orders{key: {id}}
	for k, v := range o {
		out[k] = v
	}
	return out
}

func TestCheck_AnOrderNoRequestNamed_IsAStray(t *testing.T) {
	res := record(op{"k", "a", 0, 1, created("A")}).Verify(Orders{"k": {"A"}, "ghost": {"G"}}, orderNo)
	require.False(t, res.OK())
	require.Equal(t, []string{"ghost"}, res.Strays)
	require.Contains(t, res.Report(5), "no request named, e.g. ghost")
}

// Each wrong model must accept a doctored history that the model refuses:
// otherwise the doctored histories would not prove that the check rests on
// the rule the mutant drops (as SPIN's mutants must fail, here they must
// pass what the model fails).
func TestMutants_EachWrongModelAcceptsADoctoredHistory(t *testing.T) {
	for _, m := range []struct {
		name   string
		mutant mutation
	}{
		{"a second execution replaces the first answer (two orders)", mutantTwoExecutions},
		{"a replay need not equal the first answer", mutantAnyReplay},
		{"a replay without any recorded answer", mutantReplayFromNone},
		{"the orders table is not checked", mutantOrdersUnchecked},
	} {
		t.Run(m.name, func(t *testing.T) {
			var accepted []string
			for _, c := range doctored {
				cfg := orderNo
				cfg.mutant = m.mutant
				if record(c.ops...).Verify(c.orders, cfg).OK() {
					accepted = append(accepted, c.name)
				}
			}
			require.NotEmpty(t, accepted, "no doctored history tells this wrong model from the model")
			t.Logf("the wrong model accepts: %s", strings.Join(accepted, "; "))
		})
	}
}

func TestRecorder_OverItsBound_ChecksWholeKeysSpreadOverTheRun(t *testing.T) {
	r := NewBoundedRecorder(3)
	at := func(ms int) time.Time { return r.base.Add(time.Duration(ms) * time.Millisecond) }
	add := func(key string, ms int, resp Response) {
		r.Add(Request{Key: key, Fingerprint: "a"}, at(ms), at(ms+1), resp)
	}
	add("k1", 0, unavailable)
	add("k2", 1, created("B"))
	add("k1", 2, unavailable)
	add("k3", 3, created("C"))
	add("k1", 4, created("A"))
	add("k3", 5, replayed("C"))

	// 6 operations over a bound of 3: every 2nd key, whole.
	res := r.Verify(Orders{"k1": {"A"}, "k2": {"B"}, "k3": {"C"}}, orderNo)
	require.True(t, res.OK(), res.Report(5))
	require.Equal(t, 2, res.Stride)
	require.Equal(t, 5, res.Operations, "k1 and k3, all their operations")
	require.Equal(t, 2, res.Keys)
	require.Equal(t, 1, res.Skipped)
	require.Equal(t, 1, res.Dropped)
}

func TestRecorder_OverItsBound_ChecksEveryKeyWhereSomethingHappened(t *testing.T) {
	r := NewBoundedRecorder(4)
	at := func(ms int) time.Time { return r.base.Add(time.Duration(ms) * time.Millisecond) }
	for i := range 6 { // answered 201 at once
		r.Add(Request{Key: fmt.Sprint("p", i), Fingerprint: "a"}, at(i), at(i+1), created(fmt.Sprint("P", i)))
	}
	r.Add(Request{Key: "k", Fingerprint: "a"}, at(10), at(11), unavailable)
	r.Add(Request{Key: "k", Fingerprint: "a"}, at(12), at(13), replayed("B")) // wrong: nothing committed B

	res := r.Verify(nil, orderNo)
	require.Equal(t, []string{"k"}, res.Illegal, "the key with a fault is always checked")
	require.Equal(t, 3, res.Stride)
	require.Equal(t, 4, res.Operations, "k's two, and one in three of the six plain keys")
}

func TestRecorder_Full_StopsAdmittingKeysButKeepsTheirHistoriesWhole(t *testing.T) {
	r := NewBoundedRecorder(1) // keeps up to keepFactor operations
	at := func(ms int) time.Time { return r.base.Add(time.Duration(ms) * time.Millisecond) }
	for i := range keepFactor + 2 {
		r.Add(Request{Key: fmt.Sprint("k", i), Fingerprint: "a"}, at(i), at(i), created(fmt.Sprint(i)))
	}
	r.Add(Request{Key: "k0", Fingerprint: "a"}, at(20), at(21), replayed("0")) // admitted: still recorded
	r.Add(Request{Key: "k11", Fingerprint: "a"}, at(22), at(23), replayed("11"))

	r.mu.Lock()
	require.Len(t, r.ops, keepFactor+1)
	require.Equal(t, 3, r.dropped)
	r.mu.Unlock()
	res := r.Verify(nil, orderNo)
	require.True(t, res.OK(), res.Report(5))
	require.Equal(t, 2, res.Operations, "every 11th key: k0, with its replay")
}

// reporter is a testing.TB that keeps what a check reports.
type reporter struct {
	*testing.T
	logs, errs []string
}

func (r *reporter) Helper() {}
func (r *reporter) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *reporter) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestCheck_AFailure_WritesTheVisualizationWhereTheLogSays(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvDir, dir)
	tb := &reporter{T: t}
	Check(tb, record(op{"k", "a", 0, 1, created("A")}, op{"k", "a", 2, 3, replayed("B")}), Orders{"k": {"A"}}, orderNo)

	require.Len(t, tb.logs, 1)
	require.Contains(t, tb.logs[0], "porcupine: 2 operations over 1 keys checked in")
	require.Len(t, tb.errs, 1)
	require.Contains(t, tb.errs[0], "key k:")
	_, path, ok := strings.Cut(tb.errs[0], "porcupine's visualization: ")
	require.True(t, ok, tb.errs[0])
	path = strings.TrimSpace(path)
	require.Equal(t, dir, filepath.Dir(path))
	html, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(html), "replayed")
}

func TestCheck_APass_LogsTheCountAndFailsNothing(t *testing.T) {
	tb := &reporter{T: t}
	res := Check(tb, record(legal[0].ops...), legal[0].orders, orderNo)
	require.True(t, res.OK())
	require.Empty(t, tb.errs)
	require.Len(t, tb.logs, 1)
	require.Contains(t, tb.logs[0], "porcupine: 3 operations over 1 keys checked in")
}

// Every spec's check also doctors its own history with a second order:
// a model that allows two orders fails the spec even on a clean run.
func TestCheck_AWrongModelAllowingTwoOrders_FailsTheSpecOnACleanHistory(t *testing.T) {
	wrong := orderNo
	wrong.mutant = mutantTwoExecutions
	tb := &reporter{T: t}
	res := Check(tb, record(legal[0].ops...), legal[0].orders, wrong)
	require.True(t, res.OK(), "the clean history passes the wrong model too")
	require.Len(t, tb.errs, 1)
	require.Contains(t, tb.errs[0], "history check is vacuous: it accepts this history with a second 201 for key k")

	tb = &reporter{T: t}
	Check(tb, record(legal[0].ops...), legal[0].orders, orderNo)
	require.Empty(t, tb.errs, "the model refuses the doctored copy")
}
