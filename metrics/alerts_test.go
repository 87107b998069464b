package metrics_test

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/metrics"
)

// ruleFile is the Prometheus rule file format (the subset alerting rules
// use). Unknown fields fail the decoding, which catches misspelt keys.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile("../examples/alerts.rules.yml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f ruleFile
	require.NoError(t, dec.Decode(&f))
	return f
}

// registered returns every metric the metrics package registers, with its
// label names (histograms also as _bucket with le, _sum and _count).
func registered(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	obs, err := metrics.New(reg, metrics.WithRoutes("r"), metrics.WithSharedCache("redis", newFakeSharedCache()))
	require.NoError(t, err)
	// Counters and the gauge exist from WithRoutes; histograms need a sample.
	ctx := context.Background()
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeCommitted, Duration: time.Millisecond, Final: true})
	_, end := obs.StartStage(ctx, idempotency.StageClaim, "r")
	end(idempotency.StageEnd{})

	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][]string{}
	for _, f := range families {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		out[f.GetName()] = labels
		if f.GetType().String() == "HISTOGRAM" {
			out[f.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			out[f.GetName()+"_sum"] = labels
			out[f.GetName()+"_count"] = labels
		}
	}
	require.Len(t, families, 13, "every metric has a series")
	return out
}

// labelValues are the values a label of the metrics can take; a matcher on
// one of these labels must name only these.
var labelValues = map[string][]string{
	"outcome": outcomes(idempotency.OutcomeCommitted, idempotency.OutcomeRejected, idempotency.OutcomeReleased,
		idempotency.OutcomeReplayed, idempotency.OutcomeConflict, idempotency.OutcomeInProgress,
		idempotency.OutcomeInvalid, idempotency.OutcomeUnprotected, idempotency.OutcomeStoreError,
		idempotency.OutcomeUnknown),
	"event":         outcomes(idempotency.OutcomeClaimed, idempotency.OutcomeTakenOver, idempotency.OutcomeLeaseLost, idempotency.OutcomeStoreError),
	"result":        outcomes(idempotency.OutcomeRecovered, idempotency.OutcomeReclaimed),
	"stage":         {"claim", "execute", "finalize", "replay"},
	"record_status": {string(idempotency.StatusDone), string(idempotency.StatusFailed)},
	"source":        {string(idempotency.ReplayFromCache), string(idempotency.ReplayFromShared), string(idempotency.ReplayFromStore)},
}

func outcomes(os ...idempotency.Outcome) []string {
	var out []string
	for _, o := range os {
		out = append(out, string(o))
	}
	return out
}

var (
	alertName  = regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`)
	promDur    = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	metricRef  = regexp.MustCompile(`\b(idempotency_[a-z_]+)\b\s*(\{[^}]*\})?`)
	matcher    = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*$`)
	rangeSel   = regexp.MustCompile(`\[([^\]]*)\]`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	templLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
)

func TestAlertRules_EveryRuleHasAlertExprForSeverityAndSummary(t *testing.T) {
	t.Parallel()
	f := loadRules(t)
	require.NotEmpty(t, f.Groups)
	seen := map[string]bool{}
	for _, g := range f.Groups {
		require.NotEmpty(t, g.Name, "group name")
		require.NotEmpty(t, g.Rules, "group %s has no rules", g.Name)
		for _, r := range g.Rules {
			require.Empty(t, r.Record, "only alerting rules here")
			require.Regexp(t, alertName, r.Alert, "alert name")
			require.False(t, seen[r.Alert], "alert %s defined twice", r.Alert)
			seen[r.Alert] = true
			require.NotEmpty(t, strings.TrimSpace(r.Expr), "%s: expr", r.Alert)
			require.Regexp(t, promDur, r.For, "%s: for", r.Alert)
			require.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], "%s: severity label", r.Alert)
			require.NotEmpty(t, strings.TrimSpace(r.Annotations["summary"]), "%s: summary annotation", r.Alert)
			require.NotEmpty(t, strings.TrimSpace(r.Annotations["description"]), "%s: description annotation", r.Alert)
			for name, text := range r.Annotations {
				require.Equal(t, strings.Count(text, "{{"), strings.Count(text, "}}"), "%s: %s template braces", r.Alert, name)
			}
		}
	}
	// The alerts the rules file exists for.
	for _, want := range []string{
		"IdempotencyKeyReuseConflictsHigh", "IdempotencyInProgressRatioHigh", "IdempotencyStoreErrors",
		"IdempotencyCommitOutcomeUnknown", "IdempotencyLeaseTakeoversRising", "IdempotencyReconcilerSettlingAbandonedClaims",
		"IdempotencySharedCacheDown", "IdempotencySharedCacheFlapping",
	} {
		require.True(t, seen[want], "missing alert %s", want)
	}
}

func TestAlertRules_ExprsReferenceOnlyRegisteredMetricsLabelsAndValues(t *testing.T) {
	t.Parallel()
	known := registered(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			expr := r.Expr
			requireBalanced(t, r.Alert, expr)
			for _, m := range rangeSel.FindAllStringSubmatch(expr, -1) {
				require.Regexp(t, promDur, m[1], "%s: range selector [%s]", r.Alert, m[1])
			}

			refs := metricRef.FindAllStringSubmatch(expr, -1)
			require.NotEmpty(t, refs, "%s references no idempotency metric", r.Alert)
			exprLabels := map[string]bool{}
			for _, ref := range refs {
				name, selector := ref[1], strings.Trim(ref[2], "{}")
				labels, ok := known[name]
				require.True(t, ok, "%s: %s is not a metric the metrics package registers", r.Alert, name)
				for _, l := range labels {
					exprLabels[l] = true
				}
				if selector == "" {
					continue
				}
				for _, part := range strings.Split(selector, ",") {
					m := matcher.FindStringSubmatch(part)
					require.NotNil(t, m, "%s: matcher %q", r.Alert, part)
					label, op, val := m[1], m[2], m[3]
					require.Contains(t, labels, label, "%s: %s has no label %s", r.Alert, name, label)
					allowed, bounded := labelValues[label]
					if !bounded {
						continue
					}
					vals := []string{val}
					if op == "=~" || op == "!~" {
						vals = strings.Split(val, "|")
					}
					for _, v := range vals {
						require.Contains(t, allowed, v, "%s: %s is never a value of %s", r.Alert, v, label)
					}
				}
			}

			// Grouping labels exist on the metrics, and templates use only
			// labels that survive the aggregation.
			kept := map[string]bool{}
			for _, m := range grouping.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					l = strings.TrimSpace(l)
					require.True(t, exprLabels[l] || targetLabels[l], "%s: groups by %s, which none of its metrics has", r.Alert, l)
					kept[l] = true
				}
			}
			for name, text := range r.Annotations {
				for _, m := range templLabel.FindAllStringSubmatch(text, -1) {
					require.True(t, kept[m[1]], "%s: annotation %s uses $labels.%s, which the expression aggregates away",
						r.Alert, name, m[1])
				}
			}
		}
	}
}

// requireBalanced checks that (), [] and {} nest properly outside strings.
func requireBalanced(t *testing.T, alert, expr string) {
	t.Helper()
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	var stack []rune
	inString := false
	for _, c := range expr {
		switch {
		case c == '"':
			inString = !inString
		case inString:
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case c == ')' || c == ']' || c == '}':
			require.NotEmpty(t, stack, "%s: unbalanced %c", alert, c)
			require.Equal(t, pairs[c], stack[len(stack)-1], "%s: mismatched %c", alert, c)
			stack = stack[:len(stack)-1]
		}
	}
	require.False(t, inString, "%s: unterminated string", alert)
	require.Empty(t, stack, "%s: unclosed brackets", alert)
}
