package main

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// quickConfig is -quick with the latencies scaled down tenfold and faults
// dense enough that timeouts are certain: with this seed, the first call of
// several intents is slow.
func quickConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Actions = QuickActions
	cfg.Concurrency = 32
	cfg.Seed = 7
	cfg.TimeoutRate = 0.2
	cfg.GatewayTimeout = 200 * time.Millisecond
	cfg.OrderLatency = 300 * time.Millisecond
	cfg.BaseLatency = 2 * time.Millisecond
	cfg.ReplanDelay = 50 * time.Millisecond
	cfg.LockTTL = 100 * time.Millisecond
	cfg.ResumeRate = 0.05
	cfg.DB = "sqlite://" + t.TempDir()
	return cfg
}

func TestQuickRun(t *testing.T) {
	cfg := quickConfig(t)
	var log bytes.Buffer
	results, err := Run(context.Background(), cfg, &log)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	t.Logf("\n%s", Table(results))
	byID := map[string]*Result{}
	for _, r := range results {
		byID[r.Strategy.ID] = r
		if r.Skipped != "" {
			t.Logf("(%s) skipped: %s", r.Strategy.ID, r.Skipped)
			continue
		}
		if r.Stray != 0 {
			t.Errorf("(%s) %d orders belong to no intent", r.Strategy.ID, r.Stray)
		}
		if r.Actions != QuickActions || r.ToolCalls < int64(r.Actions) || r.Requests < r.ToolCalls-r.Timeouts {
			t.Errorf("(%s) actions %d, tool calls %d, requests %d", r.Strategy.ID, r.Actions, r.ToolCalls, r.Requests)
		}
		if r.Timeouts == 0 {
			t.Errorf("(%s) no gateway timeouts: the faults did not fire", r.Strategy.ID)
		}
		if r.Orders != r.IntentsWithOrder+r.Duplicates {
			t.Errorf("(%s) orders %d != intents with an order %d + duplicates %d", r.Strategy.ID, r.Orders, r.IntentsWithOrder, r.Duplicates)
		}
	}
	a, d := byID["a"], byID["d"]
	if a == nil || d == nil || a.Skipped != "" || d.Skipped != "" {
		t.Fatalf("strategies (a) and (d) must run: %+v", results)
	}
	if d.Duplicates != 0 || d.Dirty != 0 {
		t.Errorf("(d) %d duplicates and %d dirty orders, want 0 and 0", d.Duplicates, d.Dirty)
	}
	if d.IntentsWithOrder != d.Actions {
		t.Errorf("(d) %d of %d intents have their order", d.IntentsWithOrder, d.Actions)
	}
	if d.Replays == 0 {
		t.Errorf("(d) no replays: the retries never reached the key")
	}
	if a.Duplicates == 0 {
		t.Errorf("(a) no duplicates despite %d timeouts", a.Timeouts)
	}
	// The strategies met the same faults: the first attempts are drawn alike.
	if a.Timeouts == 0 || d.Timeouts == 0 {
		t.Errorf("timeouts (a) %d, (d) %d", a.Timeouts, d.Timeouts)
	}

	// The report and the chart.
	out := t.TempDir()
	rep := Report{Command: "go run ./examples/agentsim -quick", Config: cfg, DBLabel: cfg.DB, Results: results, Date: time.Now()}
	md := rep.Markdown()
	for _, want := range []string{"| Strategy |", "(d) idempotency key per intent", "## Flags", "`-actions`", "CPU cores", "## How the simulation works"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	path := filepath.Join(out, "agentsim.png")
	if err := Chart(results, path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatalf("chart is not a PNG: %v", err)
	}
	if img.Width < 600 || img.Height < 300 {
		t.Errorf("chart is %dx%d", img.Width, img.Height)
	}
}

func TestFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-quick"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.Actions != QuickActions {
		t.Errorf("-quick: actions %d, want %d", o.Actions, QuickActions)
	}
	o, err = parseFlags([]string{"-quick", "-actions", "42", "-db", "sqlite:///tmp/x", "-strategies", "ad"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.Actions != 42 || o.DB != "sqlite:///tmp/x" || o.Strategies != "ad" {
		t.Errorf("flags = %+v", o)
	}
	d := DefaultConfig()
	if d.Actions != 10000 || d.GatewayTimeout >= d.OrderLatency {
		t.Errorf("defaults: %+v", d)
	}
	bad := DefaultConfig()
	bad.Strategies = "ax"
	if bad.validate() == nil {
		t.Error("strategy x accepted")
	}
	bad = DefaultConfig()
	bad.TimeoutRate = 1.5
	if bad.validate() == nil {
		t.Error("rate 1.5 accepted")
	}
}

func TestCountOrders(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Actions = 5
	convs := buildConversations(cfg)
	ctx := context.Background()
	db, _, _, err := openFresh(ctx, "sqlite://"+t.TempDir(), "t")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE purchase_order (id INTEGER PRIMARY KEY, user_id INTEGER, sku_id INTEGER, quantity INTEGER, coupon_id INTEGER NULL)`); err != nil {
		t.Fatal(err)
	}
	in0, in1 := convs[0][0], convs[len(convs)-1][0]
	for _, row := range []struct {
		user, sku int64
		qty       int
		coupon    any
	}{
		{in0.user, in0.sku, 2, nil}, // the intent's order
		{in0.user, in0.sku, 2, nil}, // duplicate, same parameters
		{in0.user, in0.sku, 2, 17},  // duplicate and dirty: a coupon accepted
		{in1.user, in1.sku, 1, 5},   // another intent's order
		{in1.user, in1.sku, 1, 5},   // duplicate
		{999, 20001, 1, nil},        // no such intent
	} {
		if _, err := db.Exec(`INSERT INTO purchase_order (user_id, sku_id, quantity, coupon_id) VALUES (?, ?, ?, ?)`, row.user, row.sku, row.qty, row.coupon); err != nil {
			t.Fatal(err)
		}
	}
	var res Result
	if err := countOrders(ctx, db, convs, &res); err != nil {
		t.Fatal(err)
	}
	if res.Orders != 6 || res.Duplicates != 3 || res.Dirty != 1 || res.IntentsWithOrder != 2 || res.Stray != 1 {
		t.Errorf("counted %+v", res)
	}
}

func TestConversations(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Actions = 1000
	convs := buildConversations(cfg)
	seen := map[[2]int64]bool{}
	n := 0
	for _, conv := range convs {
		if len(conv) < 1 || len(conv) > 3 {
			t.Fatalf("conversation of %d intents", len(conv))
		}
		for _, in := range conv {
			k := [2]int64{in.user, in.sku}
			if seen[k] {
				t.Fatalf("intent (%d, %d) twice", in.user, in.sku)
			}
			seen[k] = true
			if in.user != conv[0].user {
				t.Fatal("a conversation spans users")
			}
			n++
		}
	}
	if n != cfg.Actions {
		t.Fatalf("%d intents, want %d", n, cfg.Actions)
	}
	again := buildConversations(cfg)
	if again[10][0].sku != convs[10][0].sku || again[10][0].quantity != convs[10][0].quantity {
		t.Fatal("conversations are not determined by the seed")
	}
}
