package doclinks

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The guarantee table states, per backend, what survives a crash and a
// graceful stop. It sits in README.md and docs/guide.md between the lines
// "<!-- guarantee table -->" and "<!-- /guarantee table -->", the same in
// both. Every row of it cites the tests that prove it, by name (TestXxx),
// or says "not yet proven"; every test it cites exists in the repository.

const (
	tableStart = "<!-- guarantee table -->"
	tableEnd   = "<!-- /guarantee table -->"
	notProven  = "not yet proven"
)

// guaranteePages hold the table.
var guaranteePages = []string{"README.md", "docs/guide.md"}

var testNameRE = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*\b`)

// guaranteeTable returns the table's lines in page (relative to root), and
// the line number of the first.
func guaranteeTable(t *testing.T, page string) ([]string, int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	start, end := slices.Index(lines, tableStart), slices.Index(lines, tableEnd)
	if start < 0 || end < start {
		return nil, 0
	}
	return lines[start+1 : end], start + 2
}

// repoTests returns the name of every Test function in the repository's
// _test.go files.
func repoTests(t *testing.T) map[string]bool {
	t.Helper()
	funcRE := regexp.MustCompile(`(?m)^func (Test[A-Z][A-Za-z0-9_]*)\(`)
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllStringSubmatch(string(raw), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tableProblems returns what is wrong with a table's lines: a row that
// cites no test and does not say it is not yet proven, a cited test that
// does not exist.
func tableProblems(page string, lines []string, first int, tests map[string]bool) []string {
	var out []string
	rows := 0
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") || strings.HasPrefix(l, "|:") {
			continue
		}
		rows++
		if rows == 1 {
			continue // the header
		}
		where := fmt.Sprintf("%s:%d", page, first+i)
		names := testNameRE.FindAllString(l, -1)
		if len(names) == 0 && !strings.Contains(l, notProven) {
			out = append(out, where+": a row that cites no test and does not say "+notProven)
		}
		for _, n := range names {
			if !tests[n] {
				out = append(out, where+": "+n+" is not a test in the repository")
			}
		}
	}
	if rows < 2 {
		out = append(out, page+": the guarantee table has no rows")
	}
	return out
}

func TestGuaranteeTableCitesRealTests(t *testing.T) {
	tests := repoTests(t)
	if len(tests) < 100 {
		t.Fatalf("found %d tests in the repository: the scan is broken", len(tests))
	}
	var tables [][]string
	for _, p := range guaranteePages {
		lines, first := guaranteeTable(t, p)
		if lines == nil {
			t.Errorf("%s has no guarantee table (between %q and %q)", p, tableStart, tableEnd)
			continue
		}
		tables = append(tables, lines)
		for _, b := range tableProblems(p, lines, first, tests) {
			t.Error(b)
		}
	}
	if len(tables) == 2 && !slices.Equal(tables[0], tables[1]) {
		t.Errorf("the guarantee tables of %s and %s differ: keep them the same", guaranteePages[0], guaranteePages[1])
	}
}

// TestGuaranteeCheckerFindsGaps runs the check on a table of its own.
func TestGuaranteeCheckerFindsGaps(t *testing.T) {
	tests := map[string]bool{"TestReal": true}
	lines := []string{
		"| backend | crash | graceful stop |",
		"|---|---|---|",
		"| a | kept (`TestReal`) | kept (`TestReal`) |",
		"| b | kept (`TestGone`) | not yet proven |",
		"| c | kept | lost |",
	}
	got := tableProblems("p.md", lines, 10, tests)
	want := []string{
		"p.md:13: TestGone is not a test in the repository",
		"p.md:14: a row that cites no test and does not say not yet proven",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
