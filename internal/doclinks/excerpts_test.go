package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// An excerpt is a fenced code block in a page that a line
// "<!-- excerpt: PATH -->" introduces: its lines must appear, consecutive
// and unchanged, in the file PATH (relative to the repository root), so
// that code shown in prose is code that compiles.
var excerptRE = regexp.MustCompile(`^<!-- excerpt: (\S+) -->$`)

// excerptProblems returns a line per excerpt of page (relative to root)
// that its file does not hold.
func excerptProblems(t *testing.T, page string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		m := excerptRE.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		where := fmt.Sprintf("%s:%d: excerpt of %s", page, i+1, m[1])
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			out = append(out, where+": no fenced block on the next line")
			continue
		}
		var block []string
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			block = append(block, lines[j])
		}
		i = j
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m[1])))
		if err != nil {
			out = append(out, where+": no such file")
			continue
		}
		if len(block) == 0 || !containsRun(strings.Split(string(src), "\n"), block) {
			out = append(out, where+": the block is not in the file")
		}
	}
	return out
}

// containsRun reports whether block appears in lines as consecutive lines.
func containsRun(lines, block []string) bool {
	for i := 0; i+len(block) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(block)], block) {
			return true
		}
	}
	return false
}

func TestExcerptsCompiled(t *testing.T) {
	n := 0
	for _, p := range pages(t) {
		raw, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		n += strings.Count(string(raw), "<!-- excerpt: ")
		for _, b := range excerptProblems(t, p) {
			t.Error(b)
		}
	}
	if n == 0 {
		t.Error("no excerpts found in the pages: the coming-from pages carry some")
	}
}

// TestExcerptCheckerFindsEdits runs the checker on a page of its own.
func TestExcerptCheckerFindsEdits(t *testing.T) {
	dir := t.TempDir()
	old := root
	root = dir
	defer func() { root = old }()
	if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte("package a\n\nfunc A() int {\n\treturn 1\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	page := strings.Join([]string{
		"<!-- excerpt: a.go -->", "```go", "func A() int {", "\treturn 1", "}", "```",
		"<!-- excerpt: a.go -->", "```go", "func A() int {", "\treturn 2", "}", "```",
		"<!-- excerpt: b.go -->", "```go", "package b", "```",
		"<!-- excerpt: a.go -->", "text",
	}, "\n")
	if err := os.WriteFile(filepath.Join(dir, "p.md"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	got := excerptProblems(t, "p.md")
	want := []string{
		"p.md:7: excerpt of a.go: the block is not in the file",
		"p.md:13: excerpt of b.go: no such file",
		"p.md:17: excerpt of a.go: no fenced block on the next line",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
