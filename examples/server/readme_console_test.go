package main

// The README's console blocks, read as a test can run them (readme_test.go
// runs them). A block is fenced as ```console. In it a line that starts
// with "$ " is a command, continued onto the next line while it ends in a
// backslash; the lines up to the next command are what the command prints.
// Commands are split into words as a POSIX shell would (single and double
// quotes, backslashes, "#" comments, ";" between commands, "|" between the
// commands of a pipeline, "&" at the end for the background).

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// mdBlock is one fenced block of a Markdown document.
type mdBlock struct {
	file    string // the document's path from the repository's root: "README.md", "docs/http.md"
	lang    string // the fence's info string
	text    string // the lines between the fences, each ending in \n
	line    int    // the line of the opening fence, from 1
	section string // the last "## " heading before it
	heading string // the last "## " or "### " heading before it
}

// markdownBlocks returns the fenced blocks of md, the document file, in
// order.
func markdownBlocks(file, md string) []mdBlock {
	var blocks []mdBlock
	var cur *mdBlock
	section, heading := "", ""
	for i, line := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &mdBlock{file: file, lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), line: i + 1, section: section, heading: heading}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
			heading = section
		case strings.HasPrefix(line, "### "):
			heading = strings.TrimPrefix(line, "### ")
		}
	}
	return blocks
}

// consoleCommand is one command of a console block and what it prints.
type consoleCommand struct {
	file   string // the document it is in
	line   int    // the document's line of its "$ "
	source string // as typed, continuations joined
	output string // the lines shown after it, each ending in \n
}

// parseConsole splits a console block into its commands. Text before the
// first command is an error: a block must start with one.
func parseConsole(b mdBlock) ([]consoleCommand, error) {
	var cmds []consoleCommand
	lines := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if !strings.HasPrefix(line, "$ ") {
			if len(cmds) == 0 {
				return nil, fmt.Errorf("%s line %d: a console block starts with a \"$ \" command, not %q", b.file, b.line+1+i, line)
			}
			cmds[len(cmds)-1].output += line + "\n"
			continue
		}
		c := consoleCommand{file: b.file, line: b.line + 1 + i, source: strings.TrimPrefix(line, "$ ")}
		for strings.HasSuffix(c.source, `\`) && i+1 < len(lines) {
			i++
			c.source = strings.TrimSuffix(c.source, `\`) + "\n" + lines[i]
		}
		cmds = append(cmds, c)
	}
	return cmds, nil
}

// shellPipeline is the commands of one pipeline ("a | b"), each a list of
// words, and whether it runs in the background ("&").
type shellPipeline struct {
	commands   [][]string
	background bool
}

// shellParse splits a command line into its pipelines.
func shellParse(src string) ([]shellPipeline, error) {
	var (
		pipelines []shellPipeline
		cur       shellPipeline
		words     []string
		word      strings.Builder
		inWord    bool
	)
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCommand := func() error {
		endWord()
		if len(words) == 0 {
			return fmt.Errorf("an empty command in %q", src)
		}
		cur.commands = append(cur.commands, words)
		words = nil
		return nil
	}
	endPipeline := func(background bool) error {
		if err := endCommand(); err != nil {
			return err
		}
		cur.background = background
		pipelines = append(pipelines, cur)
		cur = shellPipeline{}
		return nil
	}
	rs := []rune(src)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '\\' && i+1 < len(rs) && rs[i+1] == '\n': // a continuation
			i++
		case r == '\\' && i+1 < len(rs):
			i++
			word.WriteRune(rs[i])
			inWord = true
		case r == '\'':
			inWord = true
			for i++; ; i++ {
				if i >= len(rs) {
					return nil, fmt.Errorf("an unclosed ' in %q", src)
				}
				if rs[i] == '\'' {
					break
				}
				word.WriteRune(rs[i])
			}
		case r == '"':
			inWord = true
			for i++; ; i++ {
				if i >= len(rs) {
					return nil, fmt.Errorf("an unclosed \" in %q", src)
				}
				if rs[i] == '"' {
					break
				}
				if rs[i] == '\\' && i+1 < len(rs) && strings.ContainsRune("\"\\$`", rs[i+1]) {
					i++
				}
				word.WriteRune(rs[i])
			}
		case r == '#' && !inWord: // a comment, to the end of the line
			for i+1 < len(rs) && rs[i+1] != '\n' {
				i++
			}
		case r == ' ' || r == '\t' || r == '\n':
			endWord()
		case r == '|':
			if err := endCommand(); err != nil {
				return nil, err
			}
		case r == ';':
			if err := endPipeline(false); err != nil {
				return nil, err
			}
		case r == '&':
			if err := endPipeline(true); err != nil {
				return nil, err
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	endWord()
	if len(words) > 0 || len(cur.commands) > 0 {
		if err := endPipeline(false); err != nil {
			return nil, err
		}
	}
	return pipelines, nil
}

// curlCall is a curl command line of the README: the options it uses.
type curlCall struct {
	method   string
	url      string // as written, without a scheme
	headers  [][2]string
	data     *string
	include  bool    // -i: the status line and headers are shown
	maxTime  float64 // --max-time, seconds; 0 for none
	hostPort string  // the URL's host:port
	path     string  // the URL's path and query
}

// parseCurl reads the options the README's curl commands use; any other is
// an error, so that a README that starts using one makes this test learn
// it rather than ignore it.
func parseCurl(words []string) (curlCall, error) {
	c := curlCall{}
	next := func(i *int, opt string) (string, error) {
		if *i+1 >= len(words) {
			return "", fmt.Errorf("curl %s needs a value", opt)
		}
		*i++
		return words[*i], nil
	}
	for i := 1; i < len(words); i++ {
		w := words[i]
		var err error
		switch {
		case w == "-s", w == "--silent":
		case w == "-i", w == "--include":
			c.include = true
		case w == "-si", w == "-is":
			c.include = true
		case w == "-X", w == "--request":
			c.method, err = next(&i, w)
		case w == "-H", w == "--header":
			var h string
			if h, err = next(&i, w); err == nil {
				name, value, ok := strings.Cut(h, ":")
				if !ok {
					return c, fmt.Errorf("curl -H %q: no colon", h)
				}
				c.headers = append(c.headers, [2]string{name, strings.TrimSpace(value)})
			}
		case w == "-d", w == "--data":
			var d string
			if d, err = next(&i, w); err == nil {
				c.data = &d
			}
		case w == "--max-time", w == "-m":
			var v string
			if v, err = next(&i, w); err == nil {
				_, err = fmt.Sscanf(v, "%g", &c.maxTime)
			}
		case strings.HasPrefix(w, "-"):
			return c, fmt.Errorf("curl option %q: readme_test.go does not know it", w)
		case c.url != "":
			return c, fmt.Errorf("curl: a second URL %q", w)
		default:
			c.url = w
		}
		if err != nil {
			return c, err
		}
	}
	if c.url == "" {
		return c, fmt.Errorf("curl without a URL")
	}
	u := strings.TrimPrefix(c.url, "http://")
	c.hostPort, c.path, _ = strings.Cut(u, "/")
	c.path = "/" + c.path
	if c.method == "" {
		c.method = "GET"
		if c.data != nil {
			c.method = "POST"
		}
	}
	return c, nil
}

// curlOutput is what `curl -s[i]` prints for an answer: with -i the status
// line, the headers (less those in skip) in the order Go's server writes
// them, sorted, and a blank line; then the body.
func curlOutput(include bool, proto, status string, header map[string][]string, skip map[string]bool, body string) string {
	var b strings.Builder
	if include {
		fmt.Fprintf(&b, "%s %s\n", proto, status)
		var names []string
		for name := range header {
			if !skip[name] {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range header[name] {
				fmt.Fprintf(&b, "%s: %s\n", name, v)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString(body)
	return b.String()
}

// orderNoPattern is an order number as the example makes them: "O", the
// UTC date and 16 random hex digits. The README's are examples: each stands
// for the one the server made at that point.
var orderNoPattern = regexp.MustCompile(`O\d{8}[0-9a-f]{16}`)

// volatile maps the README's example values (order numbers) to the ones
// the server made, one to one.
type volatile struct {
	readme, actual map[string]string // readme→actual, actual→readme
}

func newVolatile() *volatile {
	return &volatile{readme: map[string]string{}, actual: map[string]string{}}
}

// match reports whether actual is the README's text want, where each order
// number of want stands for one the server made: the first time it is
// seen, any order number (not standing for another already); after that,
// the same one. It binds the new ones only when the whole text matches.
func (v *volatile) match(want, actual string) (bool, string) {
	tokens := orderNoPattern.FindAllString(want, -1)
	parts := orderNoPattern.Split(want, -1)
	var re strings.Builder
	re.WriteString(`^`)
	for i, p := range parts {
		re.WriteString(regexp.QuoteMeta(p))
		if i < len(tokens) {
			re.WriteString(`(` + orderNoPattern.String() + `)`)
		}
	}
	re.WriteString(`$`)
	m := regexp.MustCompile(re.String()).FindStringSubmatch(actual)
	if m == nil {
		return false, ""
	}
	bind := map[string]string{}
	for i, tok := range tokens {
		got := m[i+1]
		if prev, ok := v.readme[tok]; ok && prev != got {
			return false, fmt.Sprintf("%s stands for %s, made earlier, but the server answered %s", tok, prev, got)
		}
		if prev, ok := bind[tok]; ok && prev != got {
			return false, fmt.Sprintf("%s stands for two order numbers, %s and %s", tok, prev, got)
		}
		if other, ok := v.actual[got]; ok && other != tok {
			return false, fmt.Sprintf("the server's %s is shown as %s earlier and as %s here", got, other, tok)
		}
		bind[tok] = got
	}
	for tok, got := range bind {
		v.readme[tok], v.actual[got] = got, tok
	}
	return true, ""
}

// substitute replaces the README's order numbers in a request by the ones
// they stand for; one not bound yet is an error (a request cannot name an
// order no answer has shown).
func (v *volatile) substitute(s string) (string, error) {
	var err error
	out := orderNoPattern.ReplaceAllStringFunc(s, func(tok string) string {
		got, ok := v.readme[tok]
		if !ok {
			err = fmt.Errorf("%s names an order no earlier answer showed", tok)
			return tok
		}
		return got
	})
	return out, err
}
