package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, from this package's directory.
var root = filepath.Join("..", "..")

// pending lists files the README links to that another branch adds. A
// missing one is allowed; one that exists fails the test, so that it is
// taken off this list once that branch is merged.
var pending []string

// linkRE matches an inline link or image, [text](target) or ![alt](target),
// with an optional "title" after the target.
var linkRE = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// prose returns the lines of a Markdown page outside fenced code blocks,
// with inline code spans blanked out (links in code are not links).
func prose(text string) []string {
	var out []string
	fence := ""
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")) {
			fence = t[:3]
			out = append(out, "")
			continue
		}
		if fence != "" {
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			out = append(out, "")
			continue
		}
		out = append(out, blankCode(l))
	}
	return out
}

// blankCode replaces inline code spans by spaces.
func blankCode(l string) string {
	var b strings.Builder
	in := false
	for _, r := range l {
		if r == '`' {
			in = !in
			b.WriteRune(' ')
			continue
		}
		if in {
			b.WriteRune(' ')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the fragments GitHub gives the page's headings: lower
// case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	fence := ""
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")) {
			fence = t[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			continue
		}
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		a := anchor(h)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// anchor returns GitHub's fragment for a heading's text.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// pages returns README.md, docs/*.md and the READMEs the docs send
// contributors to, relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "adapters/postgres/README.md", "integration/README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

// brokenLinks returns a line per link of page (relative to root) that
// leads nowhere.
func brokenLinks(t *testing.T, page string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	var broken []string
	for i, l := range prose(string(raw)) {
		for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
			}
			where := fmt.Sprintf("%s:%d: %s", page, i+1, target)
			st, err := os.Stat(filepath.Join(root, file))
			if err != nil {
				if slices.Contains(pending, filepath.ToSlash(filepath.Clean(file))) {
					continue
				}
				broken = append(broken, where+": no such file")
				continue
			}
			if frag == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(file, ".md") {
				broken = append(broken, where+": a fragment on a page that is not Markdown")
				continue
			}
			text, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(text))[frag] {
				broken = append(broken, where+": no such heading")
			}
		}
	}
	return broken
}

func TestRelativeLinksLeadSomewhere(t *testing.T) {
	for _, p := range pages(t) {
		for _, b := range brokenLinks(t, p) {
			t.Error(b)
		}
	}
}

func TestPendingFilesStillMissing(t *testing.T) {
	for _, p := range pending {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s exists now: take it off the pending list in %s", p, "internal/doclinks/doclinks_test.go")
		}
	}
}

// TestCheckerFindsBrokenLinks runs the checker on pages of its own, so that
// a checker that finds nothing cannot pass unnoticed.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	old, oldPending := root, pending
	root, pending = dir, []string{"LICENSE"}
	defer func() { root, pending = old, oldPending }()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/a.md", "# Page A\n\n## The `keyorder` command\n\n## Twice\n\n## Twice\n")
	write("img.png", "png")
	write("README.md", strings.Join([]string{
		"[ok](docs/a.md) [ok](docs/a.md#page-a) [ok](docs/a.md#the-keyorder-command) [ok](docs/a.md#twice-1)",
		"![ok](img.png) [ok](https://example.com/x.md) [ok](#here) [pending](LICENSE)",
		"[gone](docs/b.md) [bad fragment](docs/a.md#nope) [gone image](missing.png) [bad here](#nowhere)",
		"`[code](nope.md)`",
		"```",
		"[fenced](nope.md)",
		"```",
		"## Here",
	}, "\n"))
	got := brokenLinks(t, "README.md")
	want := []string{
		"README.md:3: docs/b.md: no such file",
		"README.md:3: docs/a.md#nope: no such heading",
		"README.md:3: missing.png: no such file",
		"README.md:3: #nowhere: no such heading",
	}
	if !slices.Equal(got, want) {
		t.Errorf("broken links:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
