package main

import "testing"

// The cluster family must not run in CI's quick run, which has no cluster:
// it runs only when -galera-dsns names the nodes.
func TestClusterFamilyOnlyWithDSNs(t *testing.T) {
	o, err := parseOptions([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	if o.galeraDSNs != "" {
		t.Fatalf("-quick enables the cluster family: galera-dsns %q", o.galeraDSNs)
	}
	o, err = parseOptions([]string{"-quick", "-galera-dsns", "root@tcp(127.0.0.1:5306)/test, root@tcp(127.0.0.1:5307)/test,"})
	if err != nil {
		t.Fatal(err)
	}
	if got := splitDSNs(o.galeraDSNs); len(got) != 2 || got[1] != "root@tcp(127.0.0.1:5307)/test" {
		t.Fatalf("splitDSNs = %q", got)
	}
}

// Replays of keys created through one instance go to the other's URL.
func TestGenReplayRoutesEachEntryToItsURL(t *testing.T) {
	pool := []poolEntry{{key: "a", user: 1, url: "http://n2"}, {key: "b", user: 2, url: "http://n1"}}
	gen := genReplay(pool)
	w := newWorker(0)
	for i, want := range []string{"http://n2", "http://n1", "http://n2"} {
		if rq := gen(w); rq.url != want || rq.key != pool[i%2].key {
			t.Fatalf("request %d: url %q key %q, want %q %q", i, rq.url, rq.key, want, pool[i%2].key)
		}
	}
	routedGen := routed(genBaseline, []string{"http://n1", "http://n2"})
	if rq := routedGen(newWorker(3)); rq.url != "http://n2" {
		t.Fatalf("worker 3 routed to %q, want instance 2", rq.url)
	}
}
