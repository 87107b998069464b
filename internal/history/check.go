package history

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/orderguard/idempotency"
)

// EnvDir names the directory a failed check writes its visualization to. A
// fresh directory under the system's temporary directory when unset (not
// the test's TempDir, which is removed when the test ends).
const EnvDir = "IDEMPOTENCY_HISTORY_DIR"

// Orders is what the orders table holds after a run: for each key, named as
// the requests named it, the ids of its order rows (two ids: a duplicate).
type Orders map[string][]string

// Config adapts the model to one service.
type Config struct {
	// OrderOf returns the order id a 2xx or 3xx answer's body names, to
	// match it with the orders table; "" when it names none. Defaults to
	// nil: the table must then hold one order for the key, whichever.
	OrderOf func(body string) string
	// IsFinal says which statuses are recorded, as the middleware's
	// Config.IsFinalFunc. Defaults to idempotency.DefaultIsFinal.
	IsFinal func(status int) bool
	// Timeout bounds porcupine's search. Defaults to one minute.
	Timeout time.Duration

	mutant mutation // tests of the model only
}

// Result is the outcome of a check.
type Result struct {
	Operations int           // recorded operations checked (the orders table's observations not counted)
	Keys       int           // keys checked
	Stride     int           // over the bound, one in Stride keys answered 201 at once was checked (1: all)
	Skipped    int           // keys left unchecked: sampled out, or sent after the recorder was full
	Dropped    int           // operations on those keys
	Took       time.Duration // porcupine's time, the observations included
	Outcome    porcupine.CheckResult
	Illegal    []string // keys whose history the model refuses
	Strays     []string // keys with an order that no request named

	model   porcupine.Model
	byKey   map[string][]porcupine.Operation
	history []porcupine.Operation
}

// OK reports whether the history is linearizable and the orders table holds
// no order of a key no request named.
func (res *Result) OK() bool { return res.Outcome == porcupine.Ok && len(res.Strays) == 0 }

// Verify checks the recorded history, with the orders table (nil to leave
// it out) as each key's last observation.
func (r *Recorder) Verify(orders Orders, cfg Config) *Result {
	m := model{isFinal: cfg.IsFinal, orderOf: cfg.OrderOf, mutant: cfg.mutant}
	if m.isFinal == nil {
		m.isFinal = idempotency.DefaultIsFinal
	}
	if m.orderOf == nil {
		m.orderOf = func(string) string { return "" }
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}

	recorded, keys, skipped, dropped, stride := r.sample()
	res := &Result{Operations: len(recorded), Keys: len(keys), Skipped: len(skipped), Dropped: dropped, Stride: stride,
		model: m.porcupine()}
	res.history = m.operations(recorded, orders, keys)
	for k := range orders {
		if !keys[k] && !skipped[k] {
			res.Strays = append(res.Strays, k)
		}
	}
	slices.Sort(res.Strays)

	start := time.Now()
	res.Outcome = porcupine.CheckOperationsTimeout(res.model, res.history, timeout)
	res.Took = time.Since(start)
	if res.Outcome == porcupine.Illegal {
		res.byKey = map[string][]porcupine.Operation{}
		for _, part := range partitionByKey(res.history) {
			if porcupine.CheckOperationsTimeout(res.model, part, timeout) != porcupine.Ok {
				k := part[0].Input.(input).Key
				res.Illegal = append(res.Illegal, k)
				res.byKey[k] = part
			}
		}
		slices.Sort(res.Illegal)
	}
	return res
}

// operations turns the recorded operations into porcupine's, one lane
// (ClientId) per concurrent request of a key, and appends each key's look
// at the orders table after everything else.
func (m model) operations(recorded []operation, orders Orders, keys map[string]bool) []porcupine.Operation {
	var end int64
	for _, op := range recorded {
		end = max(end, op.ret.Nanoseconds())
	}
	end++ // the orders table is read after every answer

	byKey := map[string][]int{}
	for i, op := range recorded {
		byKey[op.req.Key] = append(byKey[op.req.Key], i)
	}
	ops := make([]porcupine.Operation, 0, len(recorded)+len(keys))
	for _, idx := range byKey {
		var laneFree []int64 // per lane, when its last operation returns
		for _, i := range idx {
			op := recorded[i]
			in := input{Request: op.req}
			if m.classify(op.resp) == kindConflict {
				for _, j := range idx {
					o := recorded[j]
					in.otherFingerprint = in.otherFingerprint || (o.req.Fingerprint != op.req.Fingerprint && o.call <= op.ret)
				}
			}
			call, ret := op.call.Nanoseconds(), op.ret.Nanoseconds()
			meta := fmt.Sprintf("sent at %v, answered at %v", op.call.Round(time.Microsecond), op.ret.Round(time.Microsecond))
			if m.classify(op.resp) == kindUnknown {
				// It may take effect at any time until the table is read.
				ret = end
				meta += "; unknown outcome: may take effect until the orders table is read"
			}
			lane := slices.IndexFunc(laneFree, func(free int64) bool { return free < call })
			if lane < 0 {
				lane = len(laneFree)
				laneFree = append(laneFree, 0)
			}
			laneFree[lane] = ret
			ops = append(ops, porcupine.Operation{ClientId: lane, Input: in, Call: call, Output: op.resp, Return: ret, Metadata: meta})
		}
		if orders != nil {
			key := recorded[idx[0]].req.Key
			ids := slices.Sorted(slices.Values(orders[key]))
			ops = append(ops, porcupine.Operation{
				ClientId: len(laneFree),
				Input:    input{Request: Request{Key: key}, observe: true},
				Call:     end, Return: end,
				Output:   observation{orders: strings.Join(ids, ","), count: len(ids)},
				Metadata: "the orders table, read after the run",
			})
		}
	}
	return ops
}

// probe doctors one key of a history the model accepted, as a second
// order would show in it, and reports whether the model refuses that: a
// second executed answer, with another body, after the key's first 2xx.
// A history without an executed 2xx has nothing to doctor: caught.
//
// It doctors the key with the fewest operations: to refuse a history,
// porcupine must try every order of its concurrent operations, which for a
// key with many retries of unknown outcome grows without bound (a random
// kill's key took minutes and gigabytes). Each try is bounded; a try that
// cannot decide moves on to the next smallest key.
func (res *Result) probe() (doctored string, caught bool) {
	m := res.model
	type candidate struct {
		part []porcupine.Operation
		op   porcupine.Operation
	}
	var candidates []candidate
	for _, part := range partitionByKey(res.history) {
		for _, op := range part {
			in := op.Input.(input)
			r, ok := op.Output.(Response)
			if in.observe || !ok || r.Err != "" || r.Replayed || r.Problem != "" || r.Status < 200 || r.Status >= 300 {
				continue
			}
			candidates = append(candidates, candidate{part, op})
			break
		}
	}
	slices.SortStableFunc(candidates, func(a, b candidate) int { return len(a.part) - len(b.part) })
	for _, c := range candidates[:min(len(candidates), probeTries)] {
		in, r := c.op.Input.(input), c.op.Output.(Response)
		second := c.op
		r.Body += " (doctored)"
		second.Output, second.Call, second.Return = r, c.op.Return, c.op.Return
		bad := append(slices.Clone(c.part), second)
		switch porcupine.CheckOperationsTimeout(m, bad, probeTimeout) {
		case porcupine.Illegal:
			return fmt.Sprintf("a second %d for key %s", r.Status, in.Key), true
		case porcupine.Ok:
			return fmt.Sprintf("a second %d for key %s", r.Status, in.Key), false
		}
	}
	return "", true
}

// The probe's bounds: keys tried, and the time for each.
const (
	probeTries   = 5
	probeTimeout = 5 * time.Second
)

// Report describes what failed: the keys with an order no request named,
// and each illegal key's operations in invocation order (at most limit
// keys).
func (res *Result) Report(limit int) string {
	var b strings.Builder
	if res.Outcome == porcupine.Unknown {
		fmt.Fprintf(&b, "porcupine could not decide within its timeout (%d operations over %d keys)\n", res.Operations, res.Keys)
	}
	if len(res.Strays) > 0 {
		fmt.Fprintf(&b, "the orders table holds orders for %d keys no request named, e.g. %s\n",
			len(res.Strays), strings.Join(res.Strays[:min(5, len(res.Strays))], ", "))
	}
	if len(res.Illegal) > 0 {
		fmt.Fprintf(&b, "%d of %d keys have a history the contract does not allow", len(res.Illegal), res.Keys)
		if len(res.Illegal) > limit {
			fmt.Fprintf(&b, " (the first %d shown)", limit)
		}
		b.WriteString(":\n")
	}
	for _, k := range res.Illegal[:min(limit, len(res.Illegal))] {
		fmt.Fprintf(&b, "  key %s:\n", k)
		ops := slices.Clone(res.byKey[k])
		slices.SortStableFunc(ops, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
		for _, op := range ops {
			fmt.Fprintf(&b, "    %s   [%s]\n", describeOperation(op.Input, op.Output), op.Metadata)
		}
	}
	return b.String()
}

// Visualize writes porcupine's HTML visualization of the illegal keys'
// histories (of the whole history if none is illegal) to path.
func (res *Result) Visualize(path string) error {
	ops := res.history
	if len(res.Illegal) > 0 {
		ops = nil
		for _, k := range res.Illegal[:min(20, len(res.Illegal))] {
			ops = append(ops, res.byKey[k]...)
		}
	}
	_, info := porcupine.CheckOperationsVerbose(res.model, ops, time.Minute)
	return porcupine.VisualizePath(res.model, info, path)
}

// Check verifies the history of a spec's run with the orders table it left
// (see Verify), logs "porcupine: N operations over K keys checked in T",
// and on a failure reports the illegal keys' operations, writes porcupine's
// visualization and fails t with the file's path.
func Check(t testing.TB, r *Recorder, orders Orders, cfg Config) *Result {
	t.Helper()
	res := r.Verify(orders, cfg)
	bounded := ""
	if res.Skipped > 0 {
		bounded = fmt.Sprintf(" (sampled, one in %d of the keys answered 201 at once: %d keys with %d operations left unchecked)",
			res.Stride, res.Skipped, res.Dropped)
	}
	t.Logf("porcupine: %d operations over %d keys checked in %v%s", res.Operations, res.Keys, res.Took.Round(time.Millisecond), bounded)
	if res.OK() {
		if doctored, caught := res.probe(); !caught {
			t.Errorf("history check is vacuous: it accepts this history with %s", doctored)
		}
		return res
	}
	msg := res.Report(5)
	if res.Outcome != porcupine.Ok {
		path, err := visualizationPath(t.Name())
		if err == nil {
			err = res.Visualize(path)
		}
		if err != nil {
			msg += fmt.Sprintf("porcupine's visualization could not be written: %v\n", err)
		} else {
			msg += fmt.Sprintf("porcupine's visualization: %s\n", path)
		}
	}
	t.Errorf("history check failed:\n%s", msg)
	return res
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// visualizationPath is a file for a test's visualization under EnvDir, or
// under a fresh temporary directory that outlives the test.
func visualizationPath(test string) (string, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "idempotency-history-"); err != nil {
			return "", err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := unsafeName.ReplaceAllString(test, "_")
	return filepath.Join(dir, fmt.Sprintf("%s-%d.html", name, time.Now().UnixNano())), nil
}

// JSONField returns an OrderOf for answers whose JSON body names the order
// in a top-level field, a string or a number.
func JSONField(name string) func(body string) string {
	return func(body string) string {
		var fields map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &fields) != nil {
			return ""
		}
		raw, ok := fields[name]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
		return string(raw)
	}
}

// ReadOrders reads the orders table: query's rows are (key, order id), one
// per order row, the key spelled as the requests' Request.Key.
func ReadOrders(ctx context.Context, db *sql.DB, query string, args ...any) (Orders, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	orders := Orders{}
	for rows.Next() {
		var key, id string
		if err := rows.Scan(&key, &id); err != nil {
			return nil, err
		}
		orders[key] = append(orders[key], id)
	}
	return orders, rows.Err()
}
