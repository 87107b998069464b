package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/examples/orderconsumer/orderqueue"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/brokertest"
	"github.com/orderguard/idempotency/internal/testbin"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/postgres/pgtest"
)

// binary is this command, built once per test process.
func binary(t *testing.T) string { return testbin.Command(t, "orderconsumer") }

// process is the consumer as a process of its own, its log kept.
type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startConsumer starts the command with args and the crash point (none
// when ""), logging every settlement.
func startConsumer(t *testing.T, point string, args ...string) *process {
	t.Helper()
	log, err := os.CreateTemp(t.TempDir(), "consumer-*.log")
	require.NoError(t, err)
	p := &process{log: log.Name(), done: make(chan struct{})}
	p.cmd = exec.Command(binary(t), append([]string{"-log-level", "debug", "-retry-delay", "100ms", "-ack-wait", "1s",
		"-lease", "2s", "-reconcile-interval", "0"}, args...)...)
	p.cmd.Env = append(os.Environ(), "IDEMPOTENCY_CRASH_POINT="+point)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); log.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("consumer log:\n%s", b)
		}
	})
	return p
}

// killedItself waits for the process to die of its crash point.
func (p *process) killedItself(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		b, _ := os.ReadFile(p.log)
		t.Fatalf("the consumer never reached its crash point; its log:\n%s", b)
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "it died of SIGKILL: %v", p.cmd.ProcessState)
}

// settled returns the log's settlement lines.
func (p *process) settled(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(p.log)
	require.NoError(t, err)
	defer f.Close()
	var out []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if strings.Contains(sc.Text(), "msg=settled") {
			out = append(out, sc.Text())
		}
	}
	return out
}

// database is a fresh database of the engine and its -db URL.
func database(t *testing.T, engine string) (*sql.DB, string) {
	t.Helper()
	if engine == "postgres" {
		return pgtest.Postgres(t)
	}
	db, dsn := testdb.MySQL(t)
	return db, "mysql://" + dsn
}

// topologyOf names a topology of the test's own on broker, created now and
// deleted when t ends, and returns the command's flags that name it.
func topologyOf(t *testing.T, broker string) (orderqueue.Topology, []string) {
	t.Helper()
	stream, queue := brokertest.Name("KILLED"), brokertest.Name("killed")
	topo := orderqueue.NamedTopology(stream, "test."+stream+".create", "orderconsumer", queue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, orderqueue.EnsureTopology(ctx, broker, topo))
	t.Cleanup(func() {
		if strings.HasPrefix(broker, "nats://") {
			nc, err := orderqueue.ConnectNATS(broker)
			if err == nil {
				js, _ := jetstream.New(nc)
				_ = js.DeleteStream(context.Background(), topo.Stream)
				_ = js.DeleteStream(context.Background(), topo.DeadLetterStream)
				nc.Close()
			}
			return
		}
		if conn, err := amqp.Dial(broker); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(topo.Queue, false, false, false)
				_, _ = ch.QueueDelete(topo.DeadLetterQueue, false, false, false)
			}
			conn.Close()
		}
	})
	return topo, []string{"-broker", broker, "-stream", topo.Stream, "-subject", topo.Subject, "-queue", topo.Queue}
}

// A consumer killed with SIGKILL between a message's commit and its ack,
// or in its handler with the order written and not committed: started
// again, it gets the message again and the id makes exactly one order:
// replayed from the record after the commit; taken over once the dead
// attempt's lease ended (claim-first) or simply run (single-phase) after
// the rollback.
func TestKill9_TheIDMakesExactlyOneOrder(t *testing.T) {
	t.Parallel()
	brokers := map[string]string{"nats": brokertest.NATS(t), "amqp": brokertest.AMQP(t)}
	type run struct{ broker, engine, point, mode string }
	var runs []run
	for _, b := range []string{"nats", "amqp"} {
		for _, engine := range []string{"mysql", "postgres"} {
			runs = append(runs, run{b, engine, crashPointAfterCommit, "claim-first"})
		}
		runs = append(runs, run{b, "mysql", crashPointInHandler, "claim-first"}, run{b, "postgres", crashPointInHandler, "single-phase"})
	}
	for _, r := range runs {
		t.Run(strings.Join([]string{r.broker, r.engine, r.point, r.mode}, "/"), func(t *testing.T) {
			t.Parallel()
			db, dbURL := database(t, r.engine)
			topo, flags := topologyOf(t, brokers[r.broker])
			flags = append(flags, "-db", dbURL, "-mode", r.mode)
			first := startConsumer(t, r.point, flags...)

			pub, err := orderqueue.Dial(brokers[r.broker], topo)
			require.NoError(t, err)
			defer pub.Close()
			body := fmt.Appendf(nil, `{"user_id":7,"sku_id":%d,"quantity":1}`, orderservice.FirstSKU)
			_, err = pub.Publish(context.Background(), orderqueue.Message{User: "7", ID: "killed", Body: body})
			require.NoError(t, err)
			first.killedItself(t)
			committed := orders(t, db)
			if r.point == crashPointAfterCommit {
				require.Equal(t, 1, committed, "the order committed before the kill")
			} else {
				require.Zero(t, committed, "the kill rolled the order back")
			}

			second := startConsumer(t, "", flags...)
			var lines []string
			// Acked after the restart: by a replay after the commit, by
			// the run after the rollback (a replay of that run may be
			// logged first).
			want := "replayed=false"
			if r.point == crashPointAfterCommit {
				want = "replayed="
			}
			require.Eventually(t, func() bool {
				lines = second.settled(t)
				return slices.ContainsFunc(lines, func(l string) bool {
					return strings.Contains(l, "decision=ack") && strings.Contains(l, want)
				})
			}, 90*time.Second, 20*time.Millisecond, "the message was never acked after the restart")
			require.Equal(t, 1, orders(t, db), "one order for the id")
			// The broker may hand the message over more than once after
			// the restart (seen: deliveries 3 and 1 settled 4 ms apart on
			// a loaded machine), in any order: what must hold is which of
			// them ran the handler to an order.
			ran := 0
			for _, l := range lines {
				if strings.Contains(l, "decision=ack") && strings.Contains(l, "replayed=false") {
					ran++
				}
			}
			if r.point == crashPointAfterCommit {
				require.Zero(t, ran, "every redelivery replays the record:\n%s", strings.Join(lines, "\n"))
			} else {
				require.Equal(t, 1, ran, "one redelivery runs (the killed run left no order), any other replays it:\n%s", strings.Join(lines, "\n"))
			}
			naks := 0
			for _, l := range lines {
				if strings.Contains(l, "decision=nak") {
					naks++
				}
			}
			t.Logf("%s counts: published=1 delivered=%d (1 killed, %d after the restart, %d of them naked while the dead claim's lease ran) redelivered=%d orders=1 acked=1 dead-lettered=0",
				t.Name(), 1+len(lines), len(lines), naks, len(lines))
		})
	}
}

// orders counts the orders of user 7's key "killed".
func orders(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM purchase_order WHERE scope = '7' AND idempotency_key = 'killed'`).Scan(&n))
	return n
}

// The publish subcommand publishes a create and prints its reply: the
// order, then its replay, over both brokers.
func TestPublish_PrintsTheReply_ThenItsReplay(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{brokertest.NATS(t), brokertest.AMQP(t)} {
		t.Run(broker[:strings.Index(broker, ":")], func(t *testing.T) {
			t.Parallel()
			_, dbURL := database(t, "mysql")
			_, flags := topologyOf(t, broker)
			startConsumer(t, "", append(flags, "-db", dbURL)...)
			publish := func() string {
				args := append([]string{"publish"}, flags...)
				args = append(args, "-user", "7", "-key", "cli-1", "-reply", `{"user_id":7,"sku_id":20001,"quantity":1}`)
				out, err := exec.Command(binary(t), args...).CombinedOutput()
				require.NoError(t, err, "%s", out)
				return string(out)
			}
			first := publish()
			require.Contains(t, first, "Status: 201")
			require.Contains(t, first, `"order_no":"O`)
			require.NotContains(t, first, "Idempotent-Replayed")
			again := publish()
			require.Contains(t, again, "Idempotent-Replayed: true")
			require.Equal(t, first[strings.Index(first, "{"):], again[strings.Index(again, "{"):], "the same order")
		})
	}
}
