package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"strings"
	"testing"
)

func TestHelp_GroupsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlagsTo(&out, []string{"-h"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp (main exits 0 on it)", err)
	}
	all := newFlagSet(&out, new(flags))
	if missing := help.Ungrouped(all); len(missing) > 0 {
		t.Errorf("flags that -h does not show: %v; add each to a group of help", missing)
	}
	for _, want := range []string{"Needs: nothing: by default", "\nDatabase:\n  -db ", "\nPayment callbacks"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRun_APortInUseIsAnErrorNamingAddrBeforeTheDatabaseIsOpened(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// The database URL is not valid: were it opened first, that would be
	// the error.
	err = run([]string{"-addr", taken.Addr().String(), "-db", "oracle://nowhere"})
	if err == nil || !strings.HasPrefix(err.Error(), "-addr "+taken.Addr().String()+": the address is in use") {
		t.Fatalf("run on a taken port: %v, want an error naming -addr", err)
	}
}
