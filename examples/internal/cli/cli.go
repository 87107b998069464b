// Package cli gives the example programs one shape of -h and of start-up
// errors: -h says what the program needs running and lists its flags in
// groups, and an error at start names the flag that would fix it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
)

// Group is a titled set of flags, listed by -h in the order given.
type Group struct {
	Title string
	Flags []string
}

// Help describes a program for -h: what it does, what it needs running, an
// example or two, and its flags by group.
type Help struct {
	Usage    string // first line, e.g. "go run ./examples/server [flags]"
	About    string // what it does, one paragraph
	Needs    string // what must be running, and which flag points at it
	Examples []string
	Groups   []Group
}

// Install makes fs print h on -h and return flag.ErrHelp from Parse.
func (h Help) Install(fs *flag.FlagSet) {
	fs.Usage = func() { h.Print(fs.Output(), fs) }
}

// Print writes the help text for fs to w; flags that no group names are
// listed last, under "Other", so that none is ever left out.
func (h Help) Print(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nNeeds: %s\n", h.Usage, wrap(h.About, 76, ""), wrap(h.Needs, 76, "       ")[7:])
	if len(h.Examples) > 0 {
		fmt.Fprintln(w, "\nExamples:")
		for _, e := range h.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	groups := h.Groups
	if other := h.Ungrouped(fs); len(other) > 0 {
		groups = append(groups[:len(groups):len(groups)], Flags("Other", other...))
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g.Title)
		for _, name := range g.Flags {
			f := fs.Lookup(name)
			if f == nil {
				continue
			}
			kind, usage := flag.UnquoteUsage(f)
			line := "  -" + f.Name
			if kind != "" {
				line += " " + kind
			}
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
				usage += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "%s\n%s\n", line, wrap(usage, 76, "      "))
		}
	}
}

// Ungrouped lists fs's flags that no group names: -h would not show them.
func (h Help) Ungrouped(fs *flag.FlagSet) []string {
	named := map[string]bool{}
	for _, g := range h.Groups {
		for _, n := range g.Flags {
			named[n] = true
		}
	}
	var missing []string
	fs.VisitAll(func(f *flag.Flag) {
		if !named[f.Name] {
			missing = append(missing, f.Name)
		}
	})
	return missing
}

// wrap folds s into lines of at most width characters, each starting with
// indent.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(s) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line)
	return b.String()
}

// Listen listens on addr, the value of the flag named flagName; an address
// in use or not valid is an error that names the flag.
func Listen(flagName, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return ln, nil
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("-%s %s: the address is in use (another server, or an earlier run of this one?); stop it or choose another with -%s", flagName, addr, flagName)
	default:
		return nil, fmt.Errorf("-%s %s: %w", flagName, addr, err)
	}
}

// Unreachable reports whether err says that nothing answered at the address
// dialled (refused, unreachable, timed out, unknown host): the service a
// flag names is not running there.
func Unreachable(err error) bool {
	var dns *net.DNSError
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.As(err, &dns) ||
		(errors.As(err, &op) && op.Op == "dial")
}

// Flags is the group title listing the flags named.
func Flags(title string, names ...string) Group { return Group{Title: title, Flags: names} }
