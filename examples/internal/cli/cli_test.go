package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestHelp_ListsEveryFlagOfItsGroupsWithDefaults(t *testing.T) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.String("addr", "127.0.0.1:8080", "listen `ADDRESS`")
	fs.Bool("verbose", false, "say more")
	h := Help{
		Usage: "demo [flags]", About: "A demonstration.", Needs: "nothing.",
		Groups: []Group{Flags("Server", "addr"), Flags("Output", "verbose")},
	}
	var out bytes.Buffer
	fs.SetOutput(&out)
	h.Install(fs)
	if err := fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"Usage: demo [flags]", "Needs: nothing.", "Server:\n  -addr ADDRESS\n      listen ADDRESS (default 127.0.0.1:8080)", "Output:\n  -verbose\n      say more\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	if missing := h.Ungrouped(fs); len(missing) != 0 {
		t.Errorf("Ungrouped = %v, want none", missing)
	}
	h.Groups = h.Groups[:1]
	if missing := h.Ungrouped(fs); fmt.Sprint(missing) != "[verbose]" {
		t.Errorf("Ungrouped without the Output group = %v, want [verbose]", missing)
	}
	out.Reset()
	h.Print(&out, fs)
	if !strings.Contains(out.String(), "Other:\n  -verbose\n") {
		t.Errorf("a flag in no group is not listed under Other:\n%s", out.String())
	}
}

func TestListen_AnAddressInUseNamesTheFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, err = Listen("addr", taken.Addr().String())
	if err == nil || !strings.HasPrefix(err.Error(), "-addr "+taken.Addr().String()+": the address is in use") {
		t.Fatalf("Listen on a taken address: %v, want an error naming -addr", err)
	}
}

func TestUnreachable_TellsARefusedDialFromOtherErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = net.Dial("tcp", addr)
	if err == nil || !Unreachable(fmt.Errorf("wrapped: %w", err)) {
		t.Fatalf("Unreachable(%v) = false, want true", err)
	}
	if Unreachable(errors.New("Error 1049: Unknown database 'x'")) {
		t.Fatal("Unreachable(an answer of the server) = true, want false")
	}
}
