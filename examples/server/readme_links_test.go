package main

// Every relative link of README.md and of the guides in docs/ points at a
// file of the repository and, when it names one, at a heading of that
// file (the anchor GitHub makes of it): moving a section, renaming a
// heading or a file breaks this test, not a reader's click.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// mdLink matches an inline link or image, [text](target) or
// ![alt](target), an optional title after the target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func TestDocs_RelativeLinks_PointAtFilesAndHeadings(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{} // document → its anchors
	anchorsOf := func(doc string) map[string]bool {
		if a, ok := anchors[doc]; ok {
			return a
		}
		md, err := os.ReadFile(filepath.Join(repoRoot, doc))
		require.NoError(t, err)
		anchors[doc] = markdownAnchors(string(md))
		return anchors[doc]
	}
	links := 0
	for _, doc := range readmeDocuments(t) {
		md, err := os.ReadFile(filepath.Join(repoRoot, doc))
		require.NoError(t, err)
		for _, l := range relativeLinks(string(md)) {
			links++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := doc
			if path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(doc), path)))
				_, err := os.Stat(filepath.Join(repoRoot, target))
				if !assertNoErr(t, err, "%s line %d: [%s] points at %s, which does not exist", doc, l.line, l.target, target) {
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			require.True(t, anchorsOf(target)[anchor], "%s line %d: [%s]: %s has no heading whose anchor is #%s",
				doc, l.line, l.target, target, anchor)
		}
	}
	require.Greater(t, links, 50, "the documents' relative links")
}

func assertNoErr(t *testing.T, err error, format string, args ...any) bool {
	t.Helper()
	if err != nil {
		t.Errorf(format, args...)
		return false
	}
	return true
}

// mdTarget is one relative link: its target and the line it is on.
type mdTarget struct {
	target string
	line   int
}

// relativeLinks returns the links of md outside code (fenced blocks and
// `spans`) whose target is in the repository: no scheme, no
// protocol-relative URL.
func relativeLinks(md string) []mdTarget {
	var out []mdTarget
	fenced := false
	for i, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatchIndex(withoutCodeSpans(line), -1) {
			target := line[m[2]:m[3]]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "//") {
				continue
			}
			out = append(out, mdTarget{target: target, line: i + 1})
		}
	}
	return out
}

// withoutCodeSpans blanks the `code spans` of line, keeping its length so
// that offsets still index line.
func withoutCodeSpans(line string) string {
	b := []byte(line)
	in := false
	for i, c := range b {
		switch {
		case c == '`':
			in = !in
		case in:
			b[i] = ' '
		}
	}
	return string(b)
}

// markdownAnchors returns the anchors GitHub makes of md's headings: the
// text lower-cased, every character but letters, digits, spaces, hyphens
// and underscores dropped, spaces made hyphens; a repeated anchor gets -1,
// -2, … .
func markdownAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	count := map[string]int{}
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		text, ok := headingText(line)
		if fenced || !ok {
			continue
		}
		slug := headingSlug(text)
		if n := count[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		count[slug]++
	}
	return anchors
}

// mdLinkText matches a link in a heading, whose text alone is the anchor's.
var mdLinkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// headingText is an ATX heading's text ("## Text"), links reduced to their
// text.
func headingText(line string) (string, bool) {
	hashes := len(line) - len(strings.TrimLeft(line, "#"))
	if hashes == 0 || hashes > 6 || len(line) == hashes || line[hashes] != ' ' {
		return "", false
	}
	return mdLinkText.ReplaceAllString(strings.TrimSpace(line[hashes:]), "$1"), true
}

func headingSlug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The anchors are GitHub's.
func TestHeadingSlug_AsGitHubMakesThem(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"Try it: examples/grpcserver":                          "try-it-examplesgrpcserver",
		"B0–B2 on MariaDB over gRPC":                           "b0b2-on-mariadb-over-grpc",
		"Claim-first's cost by statement (claim-floor, X)":     "claim-firsts-cost-by-statement-claim-floor-x",
		"Redis pre-filter (optional)":                          "redis-pre-filter-optional",
		"B5: Fiber v3 `middleware/idempotency` + Redis (peer)": "b5-fiber-v3-middlewareidempotency--redis-peer",
		"snake_case and UTF-8: café":                           "snake_case-and-utf-8-café",
	} {
		require.Equal(t, want, headingSlug(text), "%q", text)
	}
	require.Equal(t, map[string]bool{"a": true, "a-1": true, "b": true},
		markdownAnchors("# A\n```\n# not a heading\n```\n## A\n### [B](x.md)\n#nospace\n"))
}
