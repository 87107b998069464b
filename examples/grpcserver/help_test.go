package main

import (
	"net"
	"strings"
	"testing"
)

func TestHelp_GroupsEveryFlag(t *testing.T) {
	if missing := help.Ungrouped(newFlagSet(new(options))); len(missing) > 0 {
		t.Errorf("flags that -h does not show: %v; add each to a group of help", missing)
	}
}

func TestRun_APortInUseIsAnErrorNamingAddrBeforeTheDatabaseIsOpened(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	err = run([]string{"-addr", taken.Addr().String(), "-db", "oracle://nowhere"})
	if err == nil || !strings.HasPrefix(err.Error(), "-addr "+taken.Addr().String()+": the address is in use") {
		t.Fatalf("run on a taken port: %v, want an error naming -addr", err)
	}
}
