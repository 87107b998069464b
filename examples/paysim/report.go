package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Table returns the results as Markdown tables: the outcome per target and
// the traffic that produced it.
func Table(results []*Result) string {
	var b strings.Builder
	b.WriteString("| Server | Orders | Events | Deliveries | Answers by status | PAID | REFUNDED | CANCELED | CREATED | Anomalies by reason | Double applications | Forgeries accepted | Off their facts' state |\n")
	b.WriteString("|---|--:|--:|--:|---|--:|--:|--:|--:|---|--:|--:|--:|\n")
	for _, r := range results {
		doubles, anomalies := "not counted (give -db)", "—"
		switch r.Counted {
		case "database":
			doubles = fmt.Sprint(r.DoubleApplications)
		case "":
		default:
			doubles = fmt.Sprintf("%d (%s)", r.DoubleApplications, r.Counted)
		}
		if r.Anomalies != nil {
			anomalies = byReason(r.Anomalies)
		}
		off := "—"
		if r.Target != naiveName {
			off = fmt.Sprint(r.Unexpected)
			if r.Unknown > 0 {
				off += fmt.Sprintf(" (%d undecided)", r.Unknown)
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %d | %d | %d | %d | %s | %s | %d of %d | %s |\n",
			r.Target, r.Orders, r.Events, r.Deliveries, byStatus(r.Answers),
			r.States["PAID"], r.States["REFUNDED"], r.States["CANCELED"], r.States["CREATED"],
			anomalies, doubles, r.ForgeriesAccepted, sum(r.Forged), off)
	}
	b.WriteString("\n")
	b.WriteString("| Server | Retries | Answers lost (injected) | Transport errors | Events never acknowledged | Later redeliveries | Concurrent pairs | Refunds before success | Cancels racing the success (answered 200) | Forged: wrong secret / tampered / unsigned / stale / another merchant's | Wall time |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d (%d) | %d / %d / %d / %d / %d | %s |\n",
			r.Target, r.Retries, r.LostAnswers, r.Transport, r.Unacked, r.Duplicates, r.Concurrent, r.RefundFirst,
			r.CancelRaces, r.CancelsAccepted, r.Forged[forgeWrongSecret], r.Forged[forgeTampered], r.Forged[forgeUnsigned],
			r.Forged[forgeStale], r.Forged[forgeForeign], r.Wall.Round(10*time.Millisecond))
	}
	return b.String()
}

func byStatus(m map[int]int64) string {
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d: %d", s, m[s]))
	}
	return strings.Join(parts, ", ")
}

func byReason(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sum(m map[forgery]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
