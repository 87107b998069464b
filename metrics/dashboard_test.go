package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/metrics"
)

// dashboardFile is the Grafana dashboard shipped for these metrics.
const dashboardFile = "../examples/grafana/idempotency.json"

// dashboardDatasource is the datasource every panel and query must use: the
// import input, so that Grafana asks for the Prometheus on import.
var dashboardDatasource = grafanaDatasource{Type: "prometheus", UID: "${DS_PROMETHEUS}"}

// targetLabels are the labels Prometheus attaches to every scraped series;
// the metrics package does not register them, but a dashboard may use them.
var targetLabels = map[string]bool{"instance": true, "job": true}

// grafanaVariables are Grafana's built-in variables a query may use besides
// the dashboard's own.
var grafanaVariables = map[string]bool{
	"__rate_interval": true, "__interval": true, "__interval_ms": true, "__range": true, "__range_s": true, "__range_ms": true,
}

// grafanaDashboard is the part of Grafana's dashboard JSON model the tests
// read.
type grafanaDashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Title         string         `json:"title"`
	UID           string         `json:"uid"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Title      string             `json:"title"`
	Type       string             `json:"type"`
	Datasource *grafanaDatasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string             `json:"refId"`
		Expr       string             `json:"expr"`
		Datasource *grafanaDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's panels
}

func (p grafanaPanel) String() string { return fmt.Sprintf("panel %q (id %d)", p.Title, p.ID) }

type grafanaVariable struct {
	Name       string             `json:"name"`
	Type       string             `json:"type"`
	Datasource *grafanaDatasource `json:"datasource"`
	Definition string             `json:"definition"`
	Query      json.RawMessage    `json:"query"`
}

// query returns the variable's query: a string, or (Grafana 10 and later)
// an object whose "query" field is the string.
func (v grafanaVariable) query(t *testing.T) string {
	t.Helper()
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var obj struct {
		Query string `json:"query"`
	}
	require.NoError(t, json.Unmarshal(v.Query, &obj), "variable %q: query is neither a string nor an object", v.Name)
	return obj.Query
}

func loadDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal(data, &d), "%s is not a dashboard JSON model", dashboardFile)
	return d
}

// allPanels returns the dashboard's panels, rows' nested panels included.
func (d grafanaDashboard) allPanels() []grafanaPanel {
	var out []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashboardQuery is one PromQL expression of the dashboard and where it is.
type dashboardQuery struct {
	where string
	expr  string
}

var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// queries returns every panel target's expression, and the series selector
// of every label_values() variable query with the label it reads.
func (d grafanaDashboard) queries(t *testing.T) (exprs []dashboardQuery, labelValues []dashboardQuery) {
	t.Helper()
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			exprs = append(exprs, dashboardQuery{where: fmt.Sprintf("%s, target %s", p, tg.RefID), expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %q", v.Name)
		q := v.query(t)
		m := labelValuesQuery.FindStringSubmatch(q)
		require.NotNil(t, m, "%s: query %q: only label_values(selector, label) is checked", where, q)
		if m[1] != "" {
			exprs = append(exprs, dashboardQuery{where: where, expr: m[1]})
		}
		labelValues = append(labelValues, dashboardQuery{where: where, expr: q})
	}
	return exprs, labelValues
}

// gatheredFamily is one metric family as gathered, with every label name
// and the values it took.
type gatheredFamily struct {
	typ    dto.MetricType
	labels map[string]map[string]bool
}

// failingExpiredLeases is a store whose work-list query fails, so that a
// Reconciler pass fails the way it does when the database is down.
type failingExpiredLeases struct{ idempotency.Store }

func (failingExpiredLeases) ExpiredLeases(context.Context, int) ([]*idempotency.Record, error) {
	return nil, errors.New("connection refused")
}

// countingRegisterer counts the collectors registered through it.
type countingRegisterer struct {
	prometheus.Registerer
	n int
}

func (c *countingRegisterer) Register(col prometheus.Collector) error {
	c.n++
	return c.Registerer.Register(col)
}

// gatherEverySeries registers the metrics on a fresh registry, drives the
// Observer through every final outcome, step, record status, reconcile
// result, Purge and stage, and a failed Reconciler pass, and returns the
// families gathered.
func gatherEverySeries(t *testing.T) map[string]*gatheredFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	counting := &countingRegisterer{Registerer: reg}
	obs, err := metrics.New(counting, metrics.WithSharedCache("redis", newFakeSharedCache()))
	require.NoError(t, err)
	ctx := context.Background()

	for _, oc := range []idempotency.Outcome{
		idempotency.OutcomeCommitted, idempotency.OutcomeRejected, idempotency.OutcomeReleased,
		idempotency.OutcomeReplayed, idempotency.OutcomeConflict, idempotency.OutcomeInProgress,
		idempotency.OutcomeInvalid, idempotency.OutcomeUnprotected, idempotency.OutcomeStoreError,
		idempotency.OutcomeUnknown,
	} {
		obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: oc, Duration: time.Millisecond, Final: true})
	}
	for _, st := range []idempotency.Status{idempotency.StatusDone, idempotency.StatusFailed} {
		obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeReplayed, Replayed: st, Duration: time.Millisecond, Final: true})
	}
	for _, step := range []idempotency.Outcome{
		idempotency.OutcomeClaimed, idempotency.OutcomeTakenOver, idempotency.OutcomeLeaseLost,
		idempotency.OutcomeCollided, idempotency.OutcomeStoreError,
	} {
		obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: step})
	}
	for _, oc := range []idempotency.Outcome{idempotency.OutcomeRecovered, idempotency.OutcomeReclaimed, idempotency.OutcomePurged} {
		obs.Observe(ctx, idempotency.Event{Outcome: oc, Count: 1})
	}
	for _, s := range []idempotency.Stage{
		idempotency.StageRequest, idempotency.StageClaim, idempotency.StageExecute, idempotency.StageFinalize, idempotency.StageReplay,
	} {
		_, end := obs.StartStage(ctx, s, "r")
		end(idempotency.StageEnd{})
	}
	// A failed pass is reported by the Reconciler itself, under its route;
	// the observation ends the run (the timeout only if none comes).
	runCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r := &idempotency.Reconciler{
		Store: failingExpiredLeases{},
		Recover: func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
			return nil, false, nil
		},
		Interval: time.Hour,
		Observer: idempotency.Observers(obs, idempotency.ObserverFunc(func(context.Context, idempotency.Event) { cancel() })),
	}
	require.ErrorIs(t, r.Run(runCtx), context.Canceled, "the failed Reconciler pass was not observed")

	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, counting.n, "every collector the metrics package registers has a series after the events above")
	out := map[string]*gatheredFamily{}
	for _, f := range families {
		g := &gatheredFamily{typ: f.GetType(), labels: map[string]map[string]bool{}}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if g.labels[l.GetName()] == nil {
					g.labels[l.GetName()] = map[string]bool{}
				}
				g.labels[l.GetName()][l.GetValue()] = true
			}
		}
		out[f.GetName()] = g
	}
	return out
}

// resolveSeries maps a metric name as queried to its family: a family's own
// name, or a histogram's name with _bucket, _sum or _count (only _bucket
// has le). A counter whose name happens to end in _count is its own family.
// It returns the label names the series carries, or why it has none.
func resolveSeries(families map[string]*gatheredFamily, name string) (family string, labels map[string]bool, problem string) {
	if f, ok := families[name]; ok {
		if f.typ == dto.MetricType_HISTOGRAM {
			return name, nil, fmt.Sprintf("%s is a histogram: query %s_bucket, %s_sum or %s_count", name, name, name, name)
		}
		return name, labelSet(f, false), ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if f := families[base]; ok && f != nil && f.typ == dto.MetricType_HISTOGRAM {
			return base, labelSet(f, suffix == "_bucket"), ""
		}
	}
	var names []string
	for n := range families {
		names = append(names, n)
	}
	slices.Sort(names)
	return "", nil, fmt.Sprintf("%s is not a metric the metrics package registers (it registers %s)", name, strings.Join(names, ", "))
}

func labelSet(f *gatheredFamily, bucket bool) map[string]bool {
	out := map[string]bool{}
	for l := range f.labels {
		out[l] = true
	}
	if bucket {
		out["le"] = true
	}
	return out
}

func labelNames(labels map[string]bool) string {
	var out []string
	for l := range labels {
		out = append(out, l)
	}
	slices.Sort(out)
	return "{" + strings.Join(out, ", ") + "}"
}

var literalAlternation = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

func TestDashboard_EveryQueriedMetricAndLabelExists(t *testing.T) {
	t.Parallel()
	families := gatherEverySeries(t)
	exprs, labelValuesQueries := loadDashboard(t).queries(t)
	require.NotEmpty(t, exprs)

	for _, q := range exprs {
		parsed, err := parsePromQL(q.expr)
		if err != nil {
			t.Errorf("%s: %v in %q", q.where, err, q.expr)
			continue
		}
		if len(parsed.selectors) == 0 {
			t.Errorf("%s: queries no metric: %q", q.where, q.expr)
		}
		seriesLabels := map[string]map[string]bool{} // metric name as queried -> its labels
		for _, sel := range parsed.selectors {
			family, labels, problem := resolveSeries(families, sel.metric)
			if problem != "" {
				t.Errorf("%s: %s", q.where, problem)
				continue
			}
			seriesLabels[sel.metric] = labels
			for _, m := range sel.matchers {
				if !labels[m.label] && !targetLabels[m.label] {
					t.Errorf("%s: %s has no label %q; it has %s (and the target labels instance, job)",
						q.where, sel.metric, m.label, labelNames(labels))
					continue
				}
				known := families[family].labels[m.label]
				if known == nil || strings.Contains(m.value, "$") {
					continue // le, a target label, or a Grafana variable
				}
				values := []string{m.value}
				if m.op == "=~" || m.op == "!~" {
					if !literalAlternation.MatchString(m.value) {
						continue // a real regular expression
					}
					values = strings.Split(m.value, "|")
				}
				for _, v := range values {
					if !known[v] {
						t.Errorf("%s: %s{%s%s%q}: %q is never a value of %s", q.where, sel.metric, m.label, m.op, m.value, v, m.label)
					}
				}
			}
		}
		for _, c := range parsed.clauses {
			for _, l := range c.labels {
				if targetLabels[l] {
					continue
				}
				if c.scope == nil { // on, ignoring, group_left, group_right: some operand has it
					found := false
					for _, labels := range seriesLabels {
						found = found || labels[l]
					}
					if !found {
						t.Errorf("%s: %s (%s) names %q, which none of its metrics has", q.where, c.keyword, strings.Join(c.labels, ", "), l)
					}
					continue
				}
				for _, metric := range c.scope {
					if labels, ok := seriesLabels[metric]; ok && !labels[l] {
						t.Errorf("%s: %s (%s) names %q, which %s does not have; it has %s",
							q.where, c.keyword, strings.Join(c.labels, ", "), l, metric, labelNames(labels))
					}
				}
			}
		}
	}

	for _, q := range labelValuesQueries {
		m := labelValuesQuery.FindStringSubmatch(q.expr)
		label := m[2]
		if m[1] == "" { // label_values(label): any metric with the label
			found := false
			for _, f := range families {
				found = found || f.labels[label] != nil
			}
			if !found && !targetLabels[label] {
				t.Errorf("%s: label_values(%s): no metric has the label %q", q.where, label, label)
			}
			continue
		}
		parsed, err := parsePromQL(m[1])
		if err != nil || len(parsed.selectors) != 1 {
			t.Errorf("%s: label_values needs one series selector, got %q", q.where, m[1])
			continue
		}
		metric := parsed.selectors[0].metric
		if _, labels, problem := resolveSeries(families, metric); problem == "" && !labels[label] && !targetLabels[label] {
			t.Errorf("%s: label_values(%s, %s): %s has no label %q; it has %s", q.where, m[1], label, metric, label, labelNames(labels))
		}
	}
}

func TestDashboard_QueriesEveryRegisteredMetric(t *testing.T) {
	t.Parallel()
	families := gatherEverySeries(t)
	exprs, _ := loadDashboard(t).queries(t)
	queried := map[string]bool{}
	for _, q := range exprs {
		parsed, err := parsePromQL(q.expr)
		require.NoError(t, err, "%s", q.where)
		for _, sel := range parsed.selectors {
			if family, _, problem := resolveSeries(families, sel.metric); problem == "" {
				queried[family] = true
			}
		}
	}
	for name := range families {
		if !queried[name] {
			t.Errorf("%s is registered but no panel of %s shows it", name, dashboardFile)
		}
	}
}

var grafanaVariableRef = regexp.MustCompile(`\$(?:\{([a-zA-Z0-9_]+)(?::[a-z]+)?\}|([a-zA-Z0-9_]+)|\[\[([a-zA-Z0-9_]+)\]\])`)

func TestDashboard_PanelsHaveUniqueIDsADatasourceTargetsAndAGridPos(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	require.NotEmpty(t, d.Title, "title")
	require.NotEmpty(t, d.UID, "uid")
	require.LessOrEqual(t, len(d.UID), 40, "Grafana limits a uid to 40 characters")
	require.Positive(t, d.SchemaVersion, "schemaVersion")

	hasInput := false
	for _, in := range d.Inputs {
		hasInput = hasInput || (in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus")
	}
	require.True(t, hasInput, `__inputs has no {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}`)

	variables := map[string]bool{}
	for _, v := range d.Templating.List {
		variables[v.Name] = true
		if v.Type == "query" {
			require.NotNil(t, v.Datasource, "variable %q has no datasource", v.Name)
			require.Equal(t, dashboardDatasource, *v.Datasource, "variable %q datasource", v.Name)
			if v.Definition != "" {
				require.Equal(t, v.Definition, v.query(t), "variable %q: definition (shown in the editor) differs from the query run", v.Name)
			}
		}
	}
	var route *grafanaVariable
	for i, v := range d.Templating.List {
		if v.Name == "route" {
			route = &d.Templating.List[i]
		}
	}
	require.NotNil(t, route, "templating has no route variable")
	m := labelValuesQuery.FindStringSubmatch(route.query(t))
	require.NotNil(t, m, "variable route: not a label_values() query")
	require.Equal(t, "route", m[2], "variable route reads another label")
	require.True(t, strings.HasPrefix(m[1], "idempotency_requests_total"), "variable route: label_values of %q, not of the outcomes metric", m[1])

	panels := d.allPanels()
	require.NotEmpty(t, panels)
	byID := map[int]grafanaPanel{}
	for _, p := range panels {
		if other, dup := byID[p.ID]; dup {
			t.Errorf("%s and %s share the id", p, other)
		}
		byID[p.ID] = p
		if p.ID <= 0 {
			t.Errorf("%s: id must be positive", p)
		}
		if p.Title == "" {
			t.Errorf("%s: no title", p)
		}
		if p.GridPos == nil {
			t.Errorf("%s: no gridPos", p)
		} else if g := *p.GridPos; g.H <= 0 || g.W <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v is outside the 24-column grid", p, g)
		}
		if p.Type == "row" {
			if len(p.Targets) > 0 {
				t.Errorf("%s: a row has no targets", p)
			}
			continue
		}
		if p.Datasource == nil || *p.Datasource != dashboardDatasource {
			t.Errorf("%s: datasource %+v, want %+v", p, p.Datasource, dashboardDatasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", p)
		}
		refIDs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refIDs[tg.RefID] {
				t.Errorf("%s: target refId %q is empty or repeated", p, tg.RefID)
			}
			refIDs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s, target %s: no expr", p, tg.RefID)
			}
			if tg.Datasource != nil && *tg.Datasource != dashboardDatasource {
				t.Errorf("%s, target %s: datasource %+v, want %+v", p, tg.RefID, *tg.Datasource, dashboardDatasource)
			}
			for _, ref := range grafanaVariableRef.FindAllStringSubmatch(tg.Expr, -1) {
				name := ref[1] + ref[2] + ref[3]
				if !variables[name] && !grafanaVariables[name] {
					t.Errorf("%s, target %s: $%s is neither a dashboard variable nor a Grafana built-in", p, tg.RefID, name)
				}
			}
		}
	}

	// Panels that overlap are moved by Grafana on load; the layout should be
	// the one written.
	for i, a := range panels {
		for _, b := range panels[i+1:] {
			if a.GridPos == nil || b.GridPos == nil {
				continue
			}
			ga, gb := *a.GridPos, *b.GridPos
			if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
				t.Errorf("%s and %s overlap", a, b)
			}
		}
	}
}

// A minimal PromQL reader: enough to find every series selector with its
// matchers and every by/without/on/ignoring/group_left/group_right label
// list, with the selectors each aggregation's labels apply to. It does not
// evaluate anything and does not know label names passed as strings (as in
// label_replace).

type promToken struct {
	kind string // ident, string, number, range, var, punct
	text string // for strings, the text between the quotes
}

type promMatcher struct{ label, op, value string }

type promSelector struct {
	metric   string
	token    int // index of the metric name's token
	matchers []promMatcher
}

// promClause is a label list. Its scope is the metric names of the
// aggregation it modifies (by, without); nil for a binary operator's
// matching (on, ignoring, group_left, group_right).
type promClause struct {
	keyword string
	labels  []string
	scope   []string
}

type promQuery struct {
	selectors []promSelector
	clauses   []promClause
}

var (
	promAggregations = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
		"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
	}
	promLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	promKeywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true}
	promOperators  = []string{"!=", "=~", "!~", "==", ">=", "<=", "(", ")", "{", "}", ",", "=", "+", "-", "*", "/", "%", "^", "<", ">", "@", ":"}
)

func lexPromQL(expr string) ([]promToken, error) {
	var toks []promToken
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, promToken{"string", expr[i+1 : j]})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated [ at %d", i)
			}
			toks = append(toks, promToken{"range", expr[i+1 : i+j]})
			i += j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdent(expr[j]) {
					j++
				}
			}
			toks = append(toks, promToken{"var", expr[i:j]})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			toks = append(toks, promToken{"ident", expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdent(expr[j]) || expr[j] == '.') {
				j++
			}
			toks = append(toks, promToken{"number", expr[i:j]})
			i = j
		default:
			op := ""
			for _, o := range promOperators {
				if strings.HasPrefix(expr[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, promToken{"punct", op})
			i += len(op)
		}
	}
	return toks, nil
}

func parsePromQL(expr string) (promQuery, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return promQuery{}, err
	}
	isPunct := func(i int, p string) bool { return i < len(toks) && toks[i].kind == "punct" && toks[i].text == p }

	// match[i] is the index of the bracket closing the one at i.
	match := map[int]int{}
	var stack []int
	for i, tk := range toks {
		switch {
		case isPunct(i, "(") || isPunct(i, "{"):
			stack = append(stack, i)
		case isPunct(i, ")") || isPunct(i, "}"):
			if len(stack) == 0 || (tk.text == ")") != isPunct(stack[len(stack)-1], "(") {
				return promQuery{}, fmt.Errorf("unbalanced %s", tk.text)
			}
			match[stack[len(stack)-1]] = i
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		return promQuery{}, fmt.Errorf("unclosed %s", toks[stack[len(stack)-1]].text)
	}

	var q promQuery
	lists := map[int][]string{} // label lists by their keyword's token index
	var aggregations []int
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch {
		case tk.kind == "var":
			return promQuery{}, fmt.Errorf("Grafana variable %s outside a string or a range", tk.text)
		case tk.kind == "punct" && tk.text == "{":
			return promQuery{}, errors.New("a selector without a metric name")
		case tk.kind != "ident":
		case promLabelLists[tk.text]:
			if !isPunct(i+1, "(") {
				if tk.text == "group_left" || tk.text == "group_right" {
					continue // no extra labels
				}
				return promQuery{}, fmt.Errorf("%s without a label list", tk.text)
			}
			var labels []string
			for j := i + 2; j < match[i+1]; j++ {
				switch {
				case toks[j].kind == "ident":
					labels = append(labels, toks[j].text)
				case !isPunct(j, ","):
					return promQuery{}, fmt.Errorf("%s (...): unexpected %q", tk.text, toks[j].text)
				}
			}
			lists[i] = labels
			if tk.text == "on" || tk.text == "ignoring" || tk.text == "group_left" || tk.text == "group_right" {
				q.clauses = append(q.clauses, promClause{keyword: tk.text, labels: labels})
			}
			i = match[i+1]
		case promAggregations[tk.text] && (isPunct(i+1, "(") ||
			i+1 < len(toks) && toks[i+1].kind == "ident" && (toks[i+1].text == "by" || toks[i+1].text == "without")):
			aggregations = append(aggregations, i)
		case isPunct(i+1, "("): // a function
		case promKeywords[tk.text]:
		default:
			sel := promSelector{metric: tk.text, token: i}
			if isPunct(i+1, "{") {
				end := match[i+1]
				for j := i + 2; j < end; j += 4 {
					if toks[j].kind != "ident" || j+2 >= end || toks[j+1].kind != "punct" || toks[j+2].kind != "string" {
						return promQuery{}, fmt.Errorf("%s{...}: malformed matcher", tk.text)
					}
					op := toks[j+1].text
					if op != "=" && op != "!=" && op != "=~" && op != "!~" {
						return promQuery{}, fmt.Errorf("%s{...}: matcher operator %q", tk.text, op)
					}
					sel.matchers = append(sel.matchers, promMatcher{label: toks[j].text, op: op, value: toks[j+2].text})
					if j+3 < end && !isPunct(j+3, ",") {
						return promQuery{}, fmt.Errorf("%s{...}: matchers not separated by commas", tk.text)
					}
				}
				i = end
			}
			q.selectors = append(q.selectors, sel)
		}
	}

	// An aggregation's by/without comes before its argument list or after.
	for _, a := range aggregations {
		body, clause := a+1, -1
		if toks[body].kind == "ident" && (toks[body].text == "by" || toks[body].text == "without") {
			clause, body = body, match[body+1]+1
			if !isPunct(body, "(") {
				return promQuery{}, fmt.Errorf("%s %s (...) has no argument list", toks[a].text, toks[clause].text)
			}
		} else if next := match[body] + 1; next < len(toks) && (toks[next].text == "by" || toks[next].text == "without") && toks[next].kind == "ident" {
			clause = next
		}
		if clause < 0 {
			continue
		}
		c := promClause{keyword: toks[clause].text, labels: lists[clause], scope: []string{}}
		for _, sel := range q.selectors {
			if sel.token > body && sel.token < match[body] {
				c.scope = append(c.scope, sel.metric)
			}
		}
		q.clauses = append(q.clauses, c)
		delete(lists, clause)
	}
	for i := range lists {
		if toks[i].text == "by" || toks[i].text == "without" {
			return promQuery{}, fmt.Errorf("%s (...) modifies no aggregation", toks[i].text)
		}
	}
	return q, nil
}

func TestDashboard_PromQLReader_FindsSelectorsMatchersAndScopedLabelLists(t *testing.T) {
	t.Parallel()
	q, err := parsePromQL(`histogram_quantile(0.99, sum by (stage, le) (rate(a_bucket{route=~"$route", stage!="x"}[$__rate_interval])))
		/ on (route) group_left sum(b_count) without (outcome) + count_total`)
	require.NoError(t, err)
	require.Len(t, q.selectors, 3)
	require.Equal(t, "a_bucket", q.selectors[0].metric)
	require.Equal(t, []promMatcher{{"route", "=~", "$route"}, {"stage", "!=", "x"}}, q.selectors[0].matchers)
	require.Equal(t, "b_count", q.selectors[1].metric)
	require.Equal(t, "count_total", q.selectors[2].metric)
	require.ElementsMatch(t, []promClause{
		{keyword: "on", labels: []string{"route"}},
		{keyword: "by", labels: []string{"stage", "le"}, scope: []string{"a_bucket"}},
		{keyword: "without", labels: []string{"outcome"}, scope: []string{"b_count"}},
	}, q.clauses)

	for _, bad := range []string{`sum(rate(x[5m])`, `{job="a"}`, `x{route=}`, `sum by (route) + x`, `x{route="$route"`, `rate(x[$__rate_interval)`} {
		_, err := parsePromQL(bad)
		require.Error(t, err, bad)
	}
}
