package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's commands split into words as a shell splits them: quotes,
// backslash continuations, comments, ";", "|" and "&".
func TestShellParse_SplitsAsAShellDoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		src  string
		want []shellPipeline
	}{
		{`curl -si -X POST localhost:8080/orders -H 'X-User-ID: 1001' \` + "\n" + `    -d '{"a":1}'`,
			[]shellPipeline{{commands: [][]string{{"curl", "-si", "-X", "POST", "localhost:8080/orders", "-H", "X-User-ID: 1001", "-d", `{"a":1}`}}}}},
		{`go run ./examples/server -db 'mysql://root@tcp(127.0.0.1:3306)/test' &   # the order API`,
			[]shellPipeline{{commands: [][]string{{"go", "run", "./examples/server", "-db", "mysql://root@tcp(127.0.0.1:3306)/test"}}, background: true}}},
		{`sleep 2; echo $?`,
			[]shellPipeline{{commands: [][]string{{"sleep", "2"}}}, {commands: [][]string{{"echo", "$?"}}}}},
		{`curl -s localhost:8081/metrics | grep 'x{route="a"'`,
			[]shellPipeline{{commands: [][]string{{"curl", "-s", "localhost:8081/metrics"}, {"grep", `x{route="a"`}}}}},
		{`echo "a \"b\" c"x`, []shellPipeline{{commands: [][]string{{"echo", `a "b" cx`}}}}},
	} {
		got, err := shellParse(tc.src)
		require.NoError(t, err, tc.src)
		require.Equal(t, tc.want, got, tc.src)
	}
	for _, bad := range []string{`echo 'open`, `echo "open`, `| grep x`, `a ;; b`} {
		_, err := shellParse(bad)
		require.Error(t, err, bad)
	}
}

// An order number the README shows stands for the one the server made
// there, the same one wherever it is shown again; anything else must match
// byte for byte.
func TestVolatile_OrderNumbersStandForTheServersOneToOne(t *testing.T) {
	t.Parallel()
	v := newVolatile()
	ok, why := v.match(`{"order_no":"O20261130aaaaaaaaaaaaaaaa"}`, `{"order_no":"O202612020123456789abcdef"}`)
	require.True(t, ok, why)
	ok, _ = v.match(`Location: /orders/O20261130aaaaaaaaaaaaaaaa`, `Location: /orders/O202612020123456789abcdef`)
	require.True(t, ok, "the same order shown again")
	ok, why = v.match(`Location: /orders/O20261130aaaaaaaaaaaaaaaa`, `Location: /orders/O20261202ffffffffffffffff`)
	require.False(t, ok, "another order where the README shows the first")
	require.Contains(t, why, "stands for O202612020123456789abcdef")
	ok, why = v.match(`O20261130bbbbbbbbbbbbbbbb`, `O202612020123456789abcdef`)
	require.False(t, ok, "one server order shown as two README orders")
	require.Contains(t, why, "shown as O20261130aaaaaaaaaaaaaaaa")
	ok, _ = v.match(`{"total_cents":2650}`, `{"total_cents":2651}`)
	require.False(t, ok, "everything but order numbers is exact")

	got, err := v.substitute(`/orders/O20261130aaaaaaaaaaaaaaaa/pay`)
	require.NoError(t, err)
	require.Equal(t, `/orders/O202612020123456789abcdef/pay`, got)
	_, err = v.substitute(`/orders/O20261130cccccccccccccccc`)
	require.Error(t, err, "an order no answer has shown")
}

// A console block is commands and what each prints.
func TestParseConsole_CommandsAndTheirOutput(t *testing.T) {
	t.Parallel()
	cmds, err := parseConsole(mdBlock{line: 10, text: "$ curl -si a \\\n    -d x\nHTTP/1.1 200 OK\n\nbody\n$ echo $?\n0\n"})
	require.NoError(t, err)
	require.Equal(t, []consoleCommand{
		{line: 11, source: "curl -si a \n    -d x", output: "HTTP/1.1 200 OK\n\nbody\n"},
		{line: 16, source: "echo $?", output: "0\n"},
	}, cmds)
	_, err = parseConsole(mdBlock{line: 1, text: "output first\n$ echo\n"})
	require.Error(t, err)
}
