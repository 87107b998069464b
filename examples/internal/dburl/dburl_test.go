package dburl

import (
	"context"
	"net"
	"strings"
	"testing"
)

func TestRedact_HidesThePasswordOfEitherForm(t *testing.T) {
	for url, want := range map[string]string{
		"mysql://app:secret@tcp(db:3306)/orders":        "mysql://app:***@tcp(db:3306)/orders",
		"postgres://app:s3@cr@t@db:5432/orders":         "postgres://app:***@db:5432/orders",
		"mysql://root@tcp(127.0.0.1:3306)/test":         "mysql://root@tcp(127.0.0.1:3306)/test",
		"sqlite://orders.db":                            "sqlite://orders.db",
		"postgres://postgres@127.0.0.1/test?sslmode=on": "postgres://postgres@127.0.0.1/test?sslmode=on",
	} {
		if got := Redact(url); got != want {
			t.Errorf("Redact(%q) = %q, want %q", url, got, want)
		}
	}
}

func TestOpen_ADatabaseThatIsNotRunningIsAnErrorNamingTheFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there now
	host, port, _ := net.SplitHostPort(addr)
	for _, url := range []string{
		"mysql://root:pw@tcp(" + addr + ")/test",
		"postgres://postgres:pw@" + host + ":" + port + "/test?sslmode=disable&connect_timeout=5",
	} {
		_, _, _, err := Open(context.Background(), url)
		if err == nil {
			t.Fatalf("Open(%s) = nil error, want one", url)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "-db "+Redact(url)+": ") || !strings.Contains(msg, "nothing answers at that address") {
			t.Errorf("Open(%s): %q, want it to name -db with the redacted URL and say nothing answers", url, msg)
		}
		if strings.Contains(msg, "pw") {
			t.Errorf("Open(%s): %q shows the password", url, msg)
		}
	}
}

func TestOpen_AnUnknownSchemeSaysWhichAreKnown(t *testing.T) {
	_, _, _, err := Open(context.Background(), "oracle://x")
	if err == nil || !strings.Contains(err.Error(), "-db oracle://x: want sqlite://PATH, mysql://DSN or postgres://") {
		t.Fatalf("Open(oracle://x) = %v", err)
	}
}
