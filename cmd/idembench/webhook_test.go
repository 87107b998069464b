package main

import "testing"

// The webhook family pays every order exactly once through the protected
// webhook and through the state machine without the record, also in a
// redelivery storm, and counts the naive twin's double
// effects there. It needs a MariaDB server: skipped without one, except in
// CI.
func TestWebhookFamily_ProtectedAppliesEveryEventOnce(t *testing.T) {
	t.Parallel()
	opts, err := parseOptions([]string{"-quick", "-webhook-events", "40", "-webhook-senders", "8"})
	if err != nil {
		t.Fatal(err)
	}
	f := testMariaDB(t, opts, "test_webhook")
	r := runFamily(t, opts, f, (*runner).runWebhook)
	got := map[string]*Point{}
	for _, p := range r.points {
		got[p.label()] = p
	}
	for _, label := range []string{"W0 mariadb naive", "W0 mariadb state machine", "W1 mariadb single-phase", "W2 mariadb storm naive", "W2 mariadb storm single-phase"} {
		p := got[label]
		switch {
		case p == nil:
			t.Fatalf("no point %q in %v", label, r.points)
		case p.Errors > 0:
			t.Errorf("%s: %d errors (first: %s)", label, p.Errors, p.FirstError)
		case p.Bench == "W1" || label == "W2 mariadb storm single-phase" || label == "W0 mariadb state machine":
			if p.Statuses["doubles"] != 0 || p.BaselineRPS == 0 {
				t.Errorf("%s: %d double effects, baseline %.0f/s; want none, against its naive twin", label, p.Statuses["doubles"], p.BaselineRPS)
			}
		}
	}
	if got["W2 mariadb storm single-phase"].Statuses["deliveries"] < 3*40 {
		t.Errorf("storm deliveries %v, want every event three times at least", got["W2 mariadb storm single-phase"].Statuses)
	}
}
