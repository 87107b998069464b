package main

// The `go test` commands the documents show, in ```sh blocks and in
// `code spans`, are not run here (scripts/test.sh runs every test), but
// each must still name what exists: its packages, and for each
// alternative of its -run pattern a test, example, benchmark or fuzz
// target in them. A renamed test or a moved package breaks this test, not
// a reader's command that would silently run nothing.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goTestFunc matches a test file's top-level test, example, benchmark or
// fuzz target.
var goTestFunc = regexp.MustCompile(`(?m)^func ((?:Test|Example|Benchmark|Fuzz)\w*)\(`)

// mdCodeSpan matches a `code span` that is a go test command.
var mdCodeSpan = regexp.MustCompile("`(go test [^`]*)`")

func TestDocs_GoTestCommands_NameTestsThatExist(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, doc := range readmeDocuments(t) {
		md, err := os.ReadFile(filepath.Join(repoRoot, doc))
		require.NoError(t, err)
		var commands []consoleCommand // source and line
		for _, b := range markdownBlocks(doc, string(md)) {
			if b.lang != "sh" {
				continue
			}
			lines := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
			for i := 0; i < len(lines); i++ {
				c := consoleCommand{file: doc, line: b.line + 1 + i, source: lines[i]}
				for strings.HasSuffix(c.source, `\`) && i+1 < len(lines) {
					i++
					c.source = strings.TrimSuffix(c.source, `\`) + " " + lines[i]
				}
				commands = append(commands, c)
			}
		}
		for i, line := range strings.Split(string(md), "\n") {
			for _, m := range mdCodeSpan.FindAllStringSubmatch(line, -1) {
				commands = append(commands, consoleCommand{file: doc, line: i + 1, source: m[1]})
			}
		}
		for _, c := range commands {
			if !strings.Contains(c.source, "go test") {
				continue
			}
			pipelines, err := shellParse(c.source)
			require.NoError(t, err, "%s line %d", c.file, c.line)
			for _, p := range pipelines {
				for _, words := range p.commands {
					for len(words) > 0 && strings.Contains(words[0], "=") { // VAR=value before the command
						words = words[1:]
					}
					if len(words) >= 2 && words[0] == "go" && words[1] == "test" {
						checkGoTest(t, c, words[2:])
						checked++
					}
				}
			}
		}
	}
	require.Greater(t, checked, 10, "the documents' go test commands")
}

// checkGoTest checks one go test command's packages and -run pattern.
func checkGoTest(t *testing.T, c consoleCommand, args []string) {
	t.Helper()
	var run string
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-run" && i+1 < len(args):
			run = args[i+1]
			i++
		case strings.HasPrefix(a, "-run="):
			run = strings.TrimPrefix(a, "-run=")
		case a == "." || strings.HasPrefix(a, "./"):
			pkgs = append(pkgs, a)
		}
	}
	if run == "NAME" || slices.Contains(pkgs, "./PACKAGE") {
		return // placeholders, as in "go test -run NAME ./PACKAGE"
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."} // go test with no package: the one it runs in, the root here
	}
	var names []string
	for _, p := range pkgs {
		dir := filepath.Join(repoRoot, strings.TrimSuffix(strings.TrimSuffix(p, "..."), "/"))
		info, err := os.Stat(dir)
		if err != nil || !info.IsDir() {
			t.Errorf("%s line %d: `go test … %s`: no such package directory", c.file, c.line, p)
			continue
		}
		names = append(names, testFuncs(t, dir, strings.HasSuffix(p, "..."))...)
	}
	require.NotEmpty(t, names, "%s line %d: `%s`: no tests in its packages", c.file, c.line, c.source)
	if run == "" {
		return
	}
	for _, alt := range strings.Split(run, "|") {
		top := strings.SplitN(alt, "/", 2)[0] // a subtest's pattern is matched below its test
		re, err := regexp.Compile(top)
		require.NoError(t, err, "%s line %d: -run %q", c.file, c.line, run)
		if re.MatchString("") {
			continue // "^$" runs no test (before -bench); ".*" every one
		}
		found := false
		for _, n := range names {
			if re.MatchString(n) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s line %d: `go test -run %s %s`: no test in those packages matches %q", c.file, c.line, run, strings.Join(pkgs, " "), top)
		}
	}
}

// testFuncs returns the test functions of the package in dir, and of the
// packages below it when all is set (a "./dir/..." pattern; a directory
// with a go.mod of its own is another module, which the pattern leaves out
// unless it is dir itself).
func testFuncs(t *testing.T, dir string, all bool) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (!all || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if path != dir {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range goTestFunc.FindAllStringSubmatch(string(src), -1) {
			names = append(names, m[1])
		}
		return nil
	})
	require.NoError(t, err)
	return names
}
