package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole program: it parses args, runs one command and returns the
// process exit code. Tests call it in-process.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return c.run(args)
}

// cli carries the program's streams and environment.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one subcommand. run parses the command's own flags from args;
// dbURL is the global --db value, which the command's --db overrides.
type command struct {
	synopsis string
	run      func(c *cli, ctx context.Context, args []string, dbURL string) error
}

// commands is set in init: the commands' flag sets read their synopsis from
// it, which a package-level initializer could not allow.
var commands map[string]command

func init() {
	commands = map[string]command{
		"migrate":   {"migrate", (*cli).migrate},
		"stats":     {"stats [--json]", (*cli).stats},
		"inspect":   {"inspect --scope S --key K [--body] [--json]", (*cli).inspect},
		"release":   {"release --scope S --key K [--yes]", (*cli).release},
		"purge":     {"purge [--older-than D]", (*cli).purge},
		"anomalies": {"anomalies [--limit N] [--json]", (*cli).anomalies},
	}
}

func (c *cli) run(args []string) int {
	global := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	global.SetOutput(c.stderr)
	dbURL := global.String("db", "", "database URL: mysql://DSN, postgres://… or sqlite://PATH (default $"+envDatabase+")")
	global.Usage = func() {} // printed below: asked for, to stdout; after a bad flag, to stderr
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, usage) // as "idemctl help"
			return exitOK
		}
		fmt.Fprint(c.stderr, usage)
		return exitUsage
	}
	rest := global.Args()
	if len(rest) == 0 {
		fmt.Fprintf(c.stderr, "idemctl: no command given; want one of %s (idemctl help explains them)\n", commandNames())
		return exitUsage
	}
	name := rest[0]
	if name == "help" {
		fmt.Fprint(c.stdout, usage)
		return exitOK
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(c.stderr, "idemctl: unknown command %q; want one of %s (idemctl help explains them)\n", name, commandNames())
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.run(c, ctx, rest[1:], *dbURL)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	switch {
	case errors.As(err, &ee) && ee.code == exitOK: // --help of a command
		return exitOK
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintf(c.stderr, "idemctl %s: %s\n", name, ee.msg)
		}
		if ee.code == exitUsage && ee.msg != "" {
			fmt.Fprintf(c.stderr, "usage: idemctl [--db URL] %s\n", cmd.synopsis)
		}
		return ee.code
	default:
		fmt.Fprintf(c.stderr, "idemctl %s: %s\n", name, withHint(err))
		return exitFailure
	}
}

func commandNames() string {
	names := make([]string, 0, len(commands)+1)
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(append(names, "help"), ", ")
}

// exitError is an error with its exit code. An empty msg means the message
// was printed already (by the flag package).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// flagSet returns a command's flag set, with --db registered so that it may
// follow the command.
func (c *cli) flagSet(name string, dbURL *string) *flag.FlagSet {
	fs := flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(dbURL, "db", *dbURL, "database URL: mysql://DSN, postgres://… or sqlite://PATH (default $"+envDatabase+")")
	fs.Usage = func() {} // printed by parse: asked for, to stdout; after a bad flag, to stderr
	return fs
}

// commandUsage prints the usage of fs's command to w.
func (c *cli) commandUsage(w io.Writer, fs *flag.FlagSet) {
	name := strings.TrimPrefix(fs.Name(), "idemctl ")
	fmt.Fprintf(w, "usage: idemctl [--db URL] %s\n\nflags:\n", commands[name].synopsis)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(c.stderr)
	fmt.Fprintln(w, "\nidemctl help prints the full usage and the exit codes.")
}

// parse parses a command's flags and refuses positional arguments. A
// command's --help prints its usage to stdout and exits 0, as "idemctl
// help" does; a bad flag prints it to stderr after the flag package's
// reason.
func (c *cli) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.commandUsage(c.stdout, fs)
			return &exitError{code: exitOK}
		}
		c.commandUsage(c.stderr, fs)
		return &exitError{code: exitUsage} // the flag package printed why
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "unexpected argument %q (flags take the form --name value)", fs.Arg(0))
	}
	return nil
}
